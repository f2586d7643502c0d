"""Queue the worker's tasks once the surrounding transaction commits.

Tasks are sent by name, so the services that queue them never import ``kb.tasks`` (which
imports the services). A broker outage is logged and nothing else: the sweep finds the work
again from the documents' status in the database.
"""

from celery import current_app
from django.db import transaction

from kb.work_lanes import INTERACTIVE_QUEUE

EMBED_DOCUMENT = "kb.tasks.embed_document"
REEMBED_COLLECTION = "kb.tasks.reembed_collection"
SYNC_SOURCE = "kb.tasks.sync_source"


def enqueue_embedding(document_id: str, *, interactive: bool) -> None:
    """On the interactive lane when someone waits for it (see CELERY_TASK_QUEUES)."""
    options = {"queue": INTERACTIVE_QUEUE} if interactive else {}
    transaction.on_commit(lambda: current_app.send_task(EMBED_DOCUMENT, (document_id,), **options), robust=True)


def enqueue_collection_reembed(collection_id: int) -> None:
    transaction.on_commit(lambda: current_app.send_task(REEMBED_COLLECTION, (collection_id,)), robust=True)


def enqueue_sync(run_id: str) -> None:
    transaction.on_commit(lambda: current_app.send_task(SYNC_SOURCE, (run_id,)), robust=True)
