"""Leases renewed by a thread of the process that holds them.

Work that holds a lease (a document being embedded, a sync run) renews it from a thread of its
own, however long one step of the work takes (a slow provider call, a fetch, a large parse).
So a lease runs out only when its process died, and can be short: another worker takes the
work over seconds after a SIGKILL, while two live workers still never hold it together.
"""

import logging
import threading
from collections.abc import Callable

from django.db import DatabaseError, connections

from kb.quiet_threads import stop_signals_blocked

logger = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    """Calls ``renew`` every ``every`` seconds until stopped. ``renew`` returns False when the
    lease is no longer ours (the work was given up or finished elsewhere): ``lost`` says so,
    and the holder stops at its next step."""

    def __init__(self, renew: Callable[[], bool], *, every: float, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.renew = renew
        self.every = every
        self.lost = False
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopping.wait(self.every):
                self.lost = not self.renew()
        except DatabaseError:
            logger.warning("could not renew the lease (%s)", self.name, exc_info=True)
        finally:
            connections.close_all()  # this thread's own connection

    def start(self) -> None:
        with stop_signals_blocked():  # the stop signals are the main thread's (kb.quiet_threads)
            super().start()

    def stop(self) -> None:
        self._stopping.set()
        self.join()
