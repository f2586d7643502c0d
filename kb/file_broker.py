"""The server-less default broker: kombu's filesystem transport with whole messages and routing
tables only, and a worker that notices a stop request at once.

Kombu writes a message by creating its file under its final name and then writing to it, while a
consumer moves and reads any file with that name without taking the writer's lock (kombu issue
#1551, open). A consumer that comes in between reads an empty message and dies with an
unrecoverable JSONDecodeError, which stops the whole system: seen under 50 MCP clients, where the
web and both workers send embedding tasks at once. Here a message is written under a name no
consumer looks at and renamed into place when complete; a rename within one folder is atomic.
Routing tables (which queue an exchange sends to) had the same kind of race, and lost messages
silently; see Channel.queue_bind and Channel._queue_bind.

Celery's loop for a polled transport like this one waits up to 2 s for a message before it looks
whether it should stop, and after Ctrl-C goes back to that wait for as long again: two of the
seven seconds an idle worker took to stop. Here the wait ends at the first poll after a stop
request.
"""

import math
import os
import threading
import time
import uuid
from contextlib import suppress
from queue import Empty
from typing import Any

from celery.worker import state as worker_state
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# Consumers only take names of the form "<stamp>_<uuid>.<queue>.msg" (kombu matches what follows
# the first dot); a name that starts with a dot has nothing before it and never matches.
UNFINISHED_PREFIX = ".writing-"
_binding = threading.Lock()


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Kombu's name: consumers take files in name order, the monotonic milliseconds first.
        stamp = round(time.monotonic() * 1000)
        final = os.path.join(self.data_folder_out, f"{stamp}_{uuid.uuid4()}.{queue}.msg")
        unfinished = os.path.join(self.data_folder_out, f"{UNFINISHED_PREFIX}{uuid.uuid4()}")
        message = str_to_bytes(dumps(payload))  # before any file exists: it may fail
        try:
            with open(unfinished, "wb") as file:
                file.write(message)
            os.replace(unfinished, final)
        except BaseException as exc:
            with suppress(OSError):
                os.unlink(unfinished)
            if isinstance(exc, OSError):
                raise ChannelError(f"Cannot add file {final!r} to directory") from exc
            raise

    def queue_bind(self, *args: Any, **kwargs: Any) -> None:
        # Kombu records a binding in the process's memory before it writes it to the table: another
        # thread of the process (a web server's) that declares the same queue meanwhile takes it as
        # done, publishes, finds no queue in the table and its message is dropped.
        with _binding:
            super().queue_bind(*args, **kwargs)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        # Kombu creates a missing exchange table by opening it for writing, which empties it before
        # the lock is taken: a process publishing at that moment reads an empty table and fails
        # (seen with several producers on a fresh var/celery). The table is made whole here, and
        # never in place of one another process made meanwhile; kombu then adds the binding to
        # it under its lock.
        table = self._exchange_file(exchange)
        if not table.exists():
            self.control_folder.mkdir(parents=True, exist_ok=True)
            unfinished = table.with_name(f"{UNFINISHED_PREFIX}{uuid.uuid4()}")
            unfinished.write_bytes(str_to_bytes(dumps([])))
            try:
                with suppress(FileExistsError):
                    os.link(unfinished, table)
            finally:
                unfinished.unlink()
        super()._queue_bind(exchange, routing_key, pattern, queue)


class Transport(filesystem.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Kombu's poll loop (virtual.Transport.drain_events), which also ends on a stop request."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                left = None if deadline is None else deadline - time.monotonic()
                if _stop_requested() or (left is not None and left <= 0):
                    raise TimeoutError from None  # what kombu raises (socket.timeout)
                time.sleep(min(self.polling_interval or 0, left if left is not None else math.inf))


def _stop_requested() -> bool:
    """A warm or cold stop of this worker was asked for: what Celery's signal handlers set, read
    as its own ``maybe_shutdown`` reads it."""
    return any(
        flag is not None and flag is not False for flag in (worker_state.should_stop, worker_state.should_terminate)
    )


def _new_lock_after_fork() -> None:
    # A pool process forked while another thread held the lock would never get it.
    global _binding
    _binding = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
