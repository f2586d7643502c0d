"""Queue the worker's tasks once the surrounding transaction commits.

Tasks are sent by name, so the services that queue them never import ``kb.tasks`` (which
imports the services). A broker outage does not fail the write: the message that could not be
sent is marked due at once, so the first sweep (or sync step) once the broker is back sends it,
instead of waiting out the deadline of a message that was sent and lost.
"""

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import current_app
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import KombuError

from kb.models import Document, DocumentStatus, SyncRun, SyncStatus
from kb.work_lanes import INTERACTIVE_QUEUE, SYNC_QUEUE

logger = logging.getLogger(__name__)

EMBED_DOCUMENT = "kb.tasks.embed_document"
REEMBED_COLLECTION = "kb.tasks.reembed_collection"
SYNC_SOURCE = "kb.tasks.sync_source"


def enqueue_embedding(document_id: str, *, interactive: bool) -> None:
    """On the interactive lane when someone waits for it (see CELERY_TASK_QUEUES)."""
    options = {"queue": INTERACTIVE_QUEUE} if interactive else {}
    _send_after_commit(EMBED_DOCUMENT, document_id, unsent=lambda: documents_due_now([document_id]), **options)


def enqueue_collection_reembed(collection_id: int) -> None:
    # A re-embed's progress is in the collection's rows: a retry (admin, API, kb_reembed) sends it again.
    _send_after_commit(REEMBED_COLLECTION, collection_id)


def enqueue_sync(run_id: str) -> None:
    due_now = lambda: SyncRun.objects.filter(pk=run_id, status=SyncStatus.QUEUED).update(  # noqa: E731
        lease_expires_at=timezone.now()
    )
    _send_after_commit(SYNC_SOURCE, run_id, unsent=due_now, queue=SYNC_QUEUE)


def documents_due_now(document_ids: Sequence[str]) -> None:
    """Pending documents whose message was not sent: the next sweep sends them."""
    Document.objects.filter(pk__in=list(document_ids), status=DocumentStatus.PENDING).update(lease_expires_at=None)


def _send_after_commit(task: str, argument: Any, *, unsent: Callable[[], Any] | None = None, **options: Any) -> None:
    def send() -> None:
        try:
            # No result is kept (CELERY_TASK_IGNORE_RESULT does not reach tasks sent by name): with a
            # Redis broker the result backend would otherwise subscribe to it first, retrying for ~20 s.
            current_app.send_task(task, (argument,), ignore_result=True, **options)
        except (KombuError, OSError):  # the broker is down or refused it: the sweep takes over
            logger.warning("could not queue %s(%s): the broker did not take it; the sweep will", task, argument)
            if unsent is not None:
                unsent()

    transaction.on_commit(send, robust=True)
