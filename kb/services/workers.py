"""Worker heartbeats: each Celery worker says it is alive, and which queues it consumes."""

from collections.abc import Sequence

from django.utils import timezone

from kb.models import WorkerHeartbeat


def worker_beat(*, hostname: str, queues: Sequence[str]) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        hostname=hostname,
        defaults={"queues": sorted(queues), "last_seen_at": now},
        create_defaults={"queues": sorted(queues), "last_seen_at": now, "started_at": now},
    )


def worker_gone(*, hostname: str) -> None:
    WorkerHeartbeat.objects.filter(hostname=hostname).delete()
