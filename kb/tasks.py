"""Celery tasks: thin, id-taking wrappers around kb.services.embedding_pipeline (documents)
and kb.services.model_switch (collections).

Tasks acknowledge late and are rejected back to the queue if their worker dies; whatever a
broker loses, the sweep finds again from the documents' status and lease in the database.
"""

import contextlib
import logging

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError
from kombu.exceptions import KombuError

from kb.embedding_providers import EmbeddingError
from kb.errors import ErrorCode, KBError
from kb.services import embedding_pipeline, model_switch, sources
from kb.task_queue import documents_due_now

logger = logging.getLogger(__name__)


class RetryableEmbeddingError(Exception):
    pass


# A provider error that may pass is retried with exponential backoff, up to EMBEDDING_MAX_RETRIES.
RETRIED_WITH_BACKOFF = {
    "acks_late": True,
    "autoretry_for": (RetryableEmbeddingError,),
    "retry_backoff": 2,
    "retry_backoff_max": 300,
    "retry_jitter": True,
    "max_retries": settings.EMBEDDING_MAX_RETRIES,
}


@shared_task(**RETRIED_WITH_BACKOFF)
def embed_document(document_id: str) -> str:
    try:
        if not embedding_pipeline.document_claim(doc_id=document_id):
            return _held_elsewhere(document_id)
    except DatabaseError as error:
        # The database is down or restarting: this message is the document's only one for now
        # (a pending document is swept again only after its deadline), so retry it.
        logger.warning("could not claim %s (database error), will retry: %s", document_id, error)
        raise RetryableEmbeddingError(str(error)) from None
    keeper = embedding_pipeline.document_lease_keeper(doc_id=document_id)
    keeper.start()
    try:
        return embedding_pipeline.document_embed(doc_id=document_id)
    except EmbeddingError as error:
        if error.retryable and embed_document.request.retries < embed_document.max_retries:
            logger.warning("embedding %s failed, will retry: %s", document_id, error.message)
            raise RetryableEmbeddingError(error.message) from None
        embedding_pipeline.document_fail(doc_id=document_id, error=error)
        return "failed"
    except DatabaseError as error:
        # Connection lost, failover...: give the document back and retry like a provider error.
        logger.warning("embedding %s hit a database error, will retry: %s", document_id, error)
        # Still down: the lease, no longer renewed, runs out and the retry takes the document over.
        with contextlib.suppress(DatabaseError):
            embedding_pipeline.document_release(
                doc_id=document_id, error=EmbeddingError(f"database error: {error}", retryable=True)
            )
        raise RetryableEmbeddingError(str(error)) from None
    except Exception as error:
        # A bug must not leave the document "processing" forever: fail it with the reason.
        logger.exception("embedding %s failed unexpectedly", document_id)
        embedding_pipeline.document_fail(
            doc_id=document_id, error=KBError(ErrorCode.DATABASE_ERROR, f"Internal error while embedding: {error!r}")
        )
        return "failed"
    finally:
        keeper.stop()


def _held_elsewhere(document_id: str) -> str:
    """A document another worker holds: if that worker died (its task redelivered to us), try again
    the moment its lease runs out, seconds from now, rather than leave it to a sweep."""
    left = embedding_pipeline.document_lease_left(doc_id=document_id)
    if left is None or embed_document.request.retries >= embed_document.max_retries:
        return "skipped"
    raise embed_document.retry(countdown=left + 0.5)


@shared_task(**RETRIED_WITH_BACKOFF)
def reembed_collection(collection_id: int) -> str:
    """Embed a collection with its next model, one batch per loop, then switch it over.

    Whatever stops it is recorded on the collection (admin, API, MCP and ``kb_reembed`` show
    it): a provider error that may pass is retried with backoff, the rest stop it until a
    curator retries or cancels."""
    try:
        while not model_switch.collection_reembed_step(collection_id=collection_id):
            pass
    except (EmbeddingError, DatabaseError) as error:
        message = error.message if isinstance(error, EmbeddingError) else f"database error: {error}"
        retryable = not isinstance(error, EmbeddingError) or error.retryable
        stopped = not retryable or reembed_collection.request.retries >= reembed_collection.max_retries
        model_switch.collection_reembed_failed(collection_id=collection_id, reason=message, stopped=stopped)
        if stopped:
            logger.error("re-embedding collection %s stopped: %s", collection_id, message)
            return "stopped"
        raise RetryableEmbeddingError(message) from None
    except Exception as error:
        logger.exception("re-embedding collection %s failed unexpectedly", collection_id)
        model_switch.collection_reembed_failed(
            collection_id=collection_id, reason=f"internal error: {error!r}", stopped=True
        )
        return "stopped"
    return "done"


@shared_task(bind=True)
def sync_source(self, run_id: str) -> str:  # noqa: ANN001 - Celery's bound task
    """One sync run of a source (kb.services.sources). Not retried: a run that fails says why,
    and a run whose worker died is given up by the next sync step; the source syncs again."""
    run = sources.sync_execute(run_id=run_id, worker=self.request.hostname or "")
    return "skipped" if run is None else run.status


@shared_task
def sweep_stale_documents() -> int:
    """Send again the documents whose message was lost or whose worker died."""
    ids = embedding_pipeline.documents_needing_embedding()
    for position, document_id in enumerate(ids):
        try:
            embed_document.delay(document_id)  # the bulk lane: nobody is waiting any more
        except (KombuError, OSError):
            # The broker went away: what was not sent stays due, for the first sweep once it is back.
            documents_due_now(ids[position:])
            raise
    if ids:
        logger.info("sweep re-queued %d documents", len(ids))
    return len(ids)


@shared_task(ignore_result=False)
def ping(value: str) -> str:
    """A round trip through broker, worker and result backend (used by health checks and tests)."""
    return f"pong:{value}"
