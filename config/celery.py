"""The Celery application; tasks live in kb/tasks.py and receive ids, never model instances.

Every worker sweeps for documents left behind (a lost message, a worker killed mid-task)
when it starts and then every KB_SWEEP_INTERVAL_SECONDS, and starts the syncs of sources that
are due every KB_SYNC_TICK_SECONDS, so no separate beat process is needed, whatever the broker.
"""

import logging
import os
import time
from typing import Any

from celery import Celery, bootsteps
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# The default broker, "filesystem://", is kombu's transport with its races fixed
# (kb/file_broker.py), wherever a connection is made; any other URL keeps its own transport.
TRANSPORT_ALIASES["filesystem"] = "kb.file_broker:Transport"

logger = logging.getLogger(__name__)

# How long a task handed to the pool may wait for a process before the pool counts as wedged
# (FreeWedgedPool): a new process starts in a second or two.
POOL_WEDGED_SECONDS = 10

app = Celery("kb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class _Repeating(bootsteps.StartStopStep):
    """Runs ``tick`` at start and every ``interval_setting`` seconds while the worker consumes.
    A failing tick is logged, never raised: it must not stop the worker, and the next one retries."""

    requires = {"celery.worker.consumer.tasks:Tasks"}
    interval_setting = ""
    failure = ""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry = None

    def start(self, parent: Any) -> None:
        from django.conf import settings

        self.prepare(parent)
        self._quietly(self.tick)
        interval = getattr(settings, self.interval_setting)
        self.timer_entry = parent.timer.call_repeatedly(interval, self._quietly, (self.tick,), priority=10)

    def stop(self, parent: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self._quietly(self.finish)

    def prepare(self, parent: Any) -> None:
        """What ``tick`` needs from the worker, read once at start."""

    def tick(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """What a clean stop leaves behind."""

    def _quietly(self, action: Any) -> None:
        from django.db import close_old_connections

        try:
            action()
        except Exception:  # the database may be down: /health says so
            logger.warning(self.failure, exc_info=True)
        finally:
            close_old_connections()


class SweepStaleDocuments(_Repeating):
    """Re-queue documents left pending or processing (lost tasks, dead workers, a broker outage)."""

    interval_setting = "KB_SWEEP_INTERVAL_SECONDS"
    failure = "sweep for stale documents failed"

    def tick(self) -> None:
        from kb.tasks import sweep_stale_documents

        sweep_stale_documents()


class Heartbeat(_Repeating):
    """Renew this worker's row in kb_workerheartbeat (hostname, queues) while it consumes."""

    interval_setting = "KB_WORKER_HEARTBEAT_SECONDS"
    failure = "worker heartbeat failed"

    def prepare(self, parent: Any) -> None:
        self.hostname = parent.hostname
        self.queues = [queue.name for queue in parent.app.amqp.queues.consume_from.values()]

    def tick(self) -> None:
        from kb.services.workers import worker_beat

        worker_beat(hostname=self.hostname, queues=self.queues)

    def finish(self) -> None:
        from kb.services.workers import worker_gone

        worker_gone(hostname=self.hostname)


class SyncSources(_Repeating):
    """Start the syncs of sources that are due, give up runs whose worker died (kb.services.sources)."""

    interval_setting = "KB_SYNC_TICK_SECONDS"
    failure = "sync step failed"

    def tick(self) -> None:
        from kb.services.sources import sync_tick

        sync_tick()


class FreeWedgedPool(_Repeating):
    """Free the worker's pool when a process of it died holding the lock of its task pipe.

    With a broker that has no event loop (the default file broker), Celery's prefork pool is
    billiard's blocking pool: every pool process reads tasks from one pipe, and an idle one waits
    in that read holding the pipe's lock. One killed while idle (the OOM killer, a stray kill -9)
    dies holding it; its replacement then waits for the lock for ever, and the worker keeps the
    task it reserved and takes no other (seen in 2 of 2 trials, while /health said all was well).

    A task handed to the pool that no process has taken for POOL_WEDGED_SECONDS means just that:
    a live reader holding the lock would have taken it within milliseconds, and the worker reserves
    no more tasks than it has processes, so one of them is free. The lock is then released once.
    A lock that is free (a process slow to start) is left alone."""

    interval_setting = "KB_SWEEP_INTERVAL_SECONDS"
    failure = "checking the worker's pool failed"

    def prepare(self, parent: Any) -> None:
        inqueue = getattr(getattr(parent.pool, "_pool", None), "_inqueue", None)
        self.pipe_lock = getattr(inqueue, "_rlock", None)  # None: the pool has no shared pipe
        self.waiting_since: dict[str, float] = {}

    def tick(self) -> None:
        from celery.worker import state

        if self.pipe_lock is None:
            return
        now = time.monotonic()
        try:
            waiting = {request.id for request in state.reserved_requests if request not in state.active_requests}
        except RuntimeError:  # the set changed as it was read (the consumer's thread): the next tick
            return
        self.waiting_since = {task: self.waiting_since.get(task, now) for task in waiting}
        if not any(now - since >= POOL_WEDGED_SECONDS for since in self.waiting_since.values()):
            return
        if self.pipe_lock.acquire(False):  # free: nobody holds it, so nothing to free
            self.pipe_lock.release()
            return
        self.pipe_lock.release()
        self.waiting_since = {}
        logger.error(
            "a task waited %d s for a pool process: one died holding the lock of the pool's task pipe; released",
            POOL_WEDGED_SECONDS,
        )


app.steps["consumer"].add(SweepStaleDocuments)
app.steps["consumer"].add(SyncSources)
app.steps["consumer"].add(Heartbeat)
app.steps["consumer"].add(FreeWedgedPool)
