"""Threads that leave the stop signals to the main thread.

A thread starts with the signal mask of the thread that starts it. Celery's pool process stops
on SIGTERM, handled by its main thread; while that thread blocks the signal during its exit, the
kernel hands a second SIGTERM to any other thread that does not block it (an ONNX Runtime or
tokenizers thread, a lease keeper), whose default action kills the process in the middle of its
exit, holding the lock of the pool's result queue: the worker's main process then hangs on that
lock until it is killed. Threads started inside ``stop_signals_blocked()`` never take them.
"""

import contextlib
import signal
from collections.abc import Iterator

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT}


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Block the stop signals in this thread meanwhile, so that threads started here inherit it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
