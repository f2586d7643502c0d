"""Which lane a document's embedding takes: interactive (someone waits for it: an agent's note,
a curator's upload) or bulk (folder imports, re-embeds). Bulk code marks itself with
``bulk_work()``; everything else small enough is interactive."""

import contextlib
import contextvars
from collections.abc import Iterator

from django.conf import settings

# The lane's Celery queue (settings.CELERY_TASK_QUEUES); bulk work takes the default one.
INTERACTIVE_QUEUE = "interactive"
# Sync runs take a queue of their own: one run queues a message per document it stores, and a
# sync asked for after a 10,000-file one had waited behind all of them (about 45 minutes). A worker
# takes from its queues in turn, so a run starts as soon as a process of the worker is free.
SYNC_QUEUE = "sync"

_bulk: contextvars.ContextVar[bool] = contextvars.ContextVar("kb_bulk_work", default=False)


@contextlib.contextmanager
def bulk_work() -> Iterator[None]:
    token = _bulk.set(True)
    try:
        yield
    finally:
        _bulk.reset(token)


def is_interactive(chunk_count: int) -> bool:
    return not _bulk.get() and chunk_count <= settings.KB_INTERACTIVE_MAX_CHUNKS
