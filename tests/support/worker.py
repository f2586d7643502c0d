"""Pretend the Celery worker ran: claim and embed documents synchronously, in this process, through
the same embedding pipeline the worker's task calls. For tests that are not about the worker itself
(tests/test_embedding_worker.py drives the pipeline directly)."""

import threading

from django.db import connection

from kb.models import Document, DocumentStatus
from kb.services.embedding_pipeline import document_claim, document_embed


def _work_on(doc_id: str) -> str | None:
    """What the worker's task does with one message: the document's final status, or None when it
    could not be claimed (done, deleted or held by another worker)."""
    if not document_claim(doc_id=doc_id):
        return None
    return document_embed(doc_id=doc_id)


def embed_now(doc_id: str) -> Document:
    """Embed one pending document now; fails the test unless it is claimed and ends ready.
    Returns the document as stored afterwards."""
    status = _work_on(doc_id)
    assert status is not None, f"document {doc_id} could not be claimed"
    assert status == DocumentStatus.READY, f"document {doc_id} ended {status!r}, not ready"
    return Document.objects.get(pk=doc_id)


def embed_pending() -> int:
    """Embed every pending document, as a worker draining its queue would (one it cannot claim is
    skipped, as the worker skips it). Returns how many documents were pending."""
    pending = list(Document.objects.filter(status=DocumentStatus.PENDING).values_list("pk", flat=True))
    for doc_id in pending:
        _work_on(doc_id)
    return len(pending)


def embed_pending_soon(delay: float) -> threading.Timer:
    """A worker of sorts: embeds the pending documents after ``delay``, from its own thread."""

    def run() -> None:
        try:
            embed_pending()
        finally:
            connection.close()

    timer = threading.Timer(delay, run)
    timer.start()
    return timer
