"""The Celery application; tasks live in kb/tasks.py and receive ids, never model instances.

Every worker sweeps for documents left behind (a lost message, a worker killed mid-task)
when it starts and then every KB_SWEEP_INTERVAL_SECONDS, so no separate beat process is
needed, whatever the broker.
"""

import logging
import os
from typing import Any

from celery import Celery, bootsteps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

logger = logging.getLogger(__name__)

app = Celery("kb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class SweepStaleDocuments(bootsteps.StartStopStep):
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry = None

    def start(self, parent: Any) -> None:
        from django.conf import settings

        self.sweep()
        self.timer_entry = parent.timer.call_repeatedly(settings.KB_SWEEP_INTERVAL_SECONDS, self.sweep, priority=10)

    def stop(self, parent: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()

    def sweep(self) -> None:
        from django.db import close_old_connections

        from kb.tasks import sweep_stale_documents

        try:
            sweep_stale_documents()
        except Exception:  # a sweep must never stop the worker; the next one retries
            logger.exception("sweep for stale documents failed")
        finally:
            close_old_connections()


class Heartbeat(bootsteps.StartStopStep):
    """Renew this worker's row in kb_workerheartbeat (hostname, queues) while it consumes."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry = None

    def start(self, parent: Any) -> None:
        from django.conf import settings

        self.hostname = parent.hostname
        self.queues = [queue.name for queue in parent.app.amqp.queues.consume_from.values()]
        self.beat()
        self.timer_entry = parent.timer.call_repeatedly(settings.KB_WORKER_HEARTBEAT_SECONDS, self.beat, priority=10)

    def stop(self, parent: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self._quietly(lambda: _workers().worker_gone(hostname=self.hostname))

    def beat(self) -> None:
        self._quietly(lambda: _workers().worker_beat(hostname=self.hostname, queues=self.queues))

    @staticmethod
    def _quietly(action: Any) -> None:
        from django.db import close_old_connections

        try:
            action()
        except Exception:  # the database may be down: /health says so; the next beat retries
            logger.warning("worker heartbeat failed", exc_info=True)
        finally:
            close_old_connections()


def _workers() -> Any:
    from kb.services import workers

    return workers


app.steps["consumer"].add(SweepStaleDocuments)
app.steps["consumer"].add(Heartbeat)
