"""Embedding documents' chunks, safely under retries, duplicate messages and dead workers.

The database is the source of truth. A worker *claims* a document with a lease that it
renews after every batch; a claim only succeeds on a pending document or one whose lease
ran out, so a redelivered or duplicated message finds nothing to do, and a document whose
worker died is taken over once its lease expires. Vectors are inserted with
``ON CONFLICT DO NOTHING`` on (chunk, model): every chunk ends with exactly one.
"""

import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from pgvector import Vector

from kb.embedding_providers import EmbeddingError, embed_texts
from kb.errors import ErrorCode, KBError
from kb.ingestion.chunking import embedding_text
from kb.leases import LeaseKeeper
from kb.models import Chunk, Collection, Document, DocumentStatus, Embedding, EmbeddingModel
from kb.selectors.ingestion import wait_until_searchable
from kb.services.documents import (
    collection_hold,
    document_lock,
    document_requeue_locked,
    pending_requeue_deadline,
)
from kb.services.embedding_models import embedding_model_record_dimensions
from kb.work_lanes import is_interactive

logger = logging.getLogger(__name__)


def _lease_deadline():  # noqa: ANN202
    return timezone.now() + timedelta(seconds=settings.KB_EMBED_LEASE_SECONDS)


def document_claim(*, doc_id: str) -> bool:
    """Take the document for embedding; False if it is done, deleted or held by a live worker."""
    now = timezone.now()
    claimable = Q(status=DocumentStatus.PENDING) | Q(status=DocumentStatus.PROCESSING, lease_expires_at__lt=now)

    return bool(
        Document.objects.filter(claimable, pk=doc_id).update(
            status=DocumentStatus.PROCESSING,
            lease_expires_at=_lease_deadline(),
            embed_attempts=F("embed_attempts") + 1,
            updated_at=now,
        )
    )


def document_lease_keeper(*, doc_id: str) -> LeaseKeeper:
    """The thread that renews the lease of a document this worker claimed, while it embeds it."""

    def renew() -> bool:
        held = Document.objects.filter(pk=doc_id, status=DocumentStatus.PROCESSING)
        return bool(held.update(lease_expires_at=_lease_deadline()))

    return LeaseKeeper(renew, every=settings.KB_EMBED_LEASE_SECONDS / 3, name=f"embed-lease-{doc_id}")


def document_lease_left(*, doc_id: str) -> float | None:
    """Seconds until another worker's lease on the document runs out; None when nobody holds one."""
    expires = (
        Document.objects.filter(pk=doc_id, status=DocumentStatus.PROCESSING, lease_expires_at__gt=timezone.now())
        .values_list("lease_expires_at", flat=True)
        .first()
    )
    return None if expires is None else (expires - timezone.now()).total_seconds()


def document_embed(*, doc_id: str) -> str:
    """Embed every chunk of a claimed document that lacks a vector; returns the final status.

    Raises EmbeddingError (retryable or not) with the document released back to pending.
    """
    while True:
        try:
            document = Document.objects.select_related(
                "collection__embedding_model", "collection__next_embedding_model"
            ).get(pk=doc_id)
        except Document.DoesNotExist:
            return "deleted"
        collection = document.collection
        try:
            if not _embed_with(document, collection.embedding_model):
                return "deleted"
        except EmbeddingError as error:
            document_release(doc_id=doc_id, error=error)
            raise
        if collection.next_embedding_model:
            # Best effort: a failing next model must not fail documents that search can already use;
            # the collection's re-embed task fills what is missing and records why it cannot.
            try:
                if not _embed_with(document, collection.next_embedding_model):
                    return "deleted"
            except EmbeddingError as error:
                logger.warning("document %s: no vectors of %s yet: %s", doc_id, collection.next_embedding_model, error)
        status = _finish(doc_id, collection)
        if status is not None:
            return status
        logger.info("document %s: its collection switched models while it was embedded; again", doc_id)


def _embed_with(document: Document, model: EmbeddingModel) -> bool:
    """Give every chunk of the document a vector of ``model``; False when it was deleted meanwhile."""
    while True:
        batch = unembedded_batch(Chunk.objects.filter(document_id=document.pk).order_by("index"), model)
        if not batch:
            return True
        vectors = embed_texts(model.provider, model.name, [text for _, text in batch])
        if not _store_vectors(document, model, [chunk_id for chunk_id, _ in batch], vectors):
            return False


def unembedded_batch(chunks: QuerySet[Chunk], model: EmbeddingModel) -> list[tuple[int, str]]:
    """The next batch of ``chunks`` without a vector of ``model``: (chunk id, the text to embed)."""
    rows = chunks.exclude(Exists(Embedding.objects.filter(chunk=OuterRef("pk"), model=model))).values_list(
        "id", "content", "heading_path"
    )[: settings.EMBEDDING_BATCH_SIZE]
    return [(chunk_id, embedding_text(content, heading_path)) for chunk_id, content, heading_path in rows]


def _store_vectors(document: Document, model: EmbeddingModel, chunk_ids: list[int], vectors: list[list[float]]) -> bool:
    """Insert a batch and renew the lease; False when the document was deleted meanwhile.

    The collection first, as writers take it (source_lock): the vectors refer to it, so their
    insert takes its row FOR KEY SHARE. Taken after the document's row, it deadlocked with a
    deletion of the collection, which holds that row and then deletes the documents."""
    with transaction.atomic():
        try:
            collection_hold(collection=document.collection)
        except KBError:  # deleted, and its documents with it
            return False
        renewed = Document.objects.filter(pk=document.pk).update(lease_expires_at=_lease_deadline())
        if not renewed:
            return False
        insert_vectors(model, chunk_ids, vectors)
        refresh_embedded_counts(document.collection, Document.objects.filter(pk=document.pk))
    return True


def insert_vectors(
    model: EmbeddingModel, chunk_ids: list[int], vectors: list[list[float]], *, skip_locked: bool = False
) -> None:
    """Store vectors of ``model`` for chunks that still exist; a chunk's existing vector is kept.

    ``skip_locked``: a chunk that a transaction is deleting is left out at once instead of waited
    for, for a caller that holds no lock of the chunks' documents (a collection's re-embed, which
    finds a chunk left out again if it stays). Waiting, its share locks, taken chunk by chunk in
    the batch's order, deadlocked with writers deleting the same chunks in another order."""
    model = embedding_model_record_dimensions(model=model, dimensions=len(vectors[0]))
    with connection.cursor() as cursor:
        # Only chunks that still exist: an update may have replaced them meanwhile. Share-locked as
        # the foreign key's own check would: a deletion committed after this statement's snapshot
        # then skips the chunk instead of failing the whole batch on the key (a switch under
        # updates had gone to "retrying", then "stopped", on that error).
        cursor.execute(
            f"""
            INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at)
            SELECT c.id, %s, c.collection_id, v.vector::vector, now()
            FROM unnest(%s::bigint[], %s::text[]) AS v(chunk_id, vector)
            JOIN kb_chunk AS c ON c.id = v.chunk_id
            FOR KEY SHARE OF c {"SKIP LOCKED" if skip_locked else ""}
            ON CONFLICT (chunk_id, model_id) DO NOTHING
            """,
            [model.pk, chunk_ids, [Vector(vector).to_text() for vector in vectors]],
        )


# Vectors deleted per statement by vectors_prune: each statement holds its locks briefly, however
# many vectors a large collection leaves behind.
PRUNE_BATCH_SIZE = 10_000


def vectors_prune(*, collection_id: int, doc_id: str | None = None) -> int:
    """Delete the collection's vectors (only the document's, if one is named) of the models it
    neither searches with nor is switching to, and return how many went: what a finished or
    cancelled switch left, and what a worker that had read the collection before a switch wrote
    after it. They are no use to this collection and slow every other collection's search through
    that model's HNSW index (its filtered scan walks past them).

    Each statement reads the collection's models itself and share-locks its row, as writers do
    (collection_hold): a switch, which takes the row for update, waits for the statement, then
    sees what it deleted; a statement that waited for a switch reads the models it set. So neither
    a switch that starts meanwhile nor one back to the pruned model can lose vectors it needs."""
    document_chunks = "AND e.chunk_id IN (SELECT id FROM kb_chunk WHERE document_id = %(doc)s)" if doc_id else ""
    deleted = 0
    for model_id in EmbeddingModel.objects.values_list("pk", flat=True):  # a few: each its own index lookups
        while True:
            with connection.cursor() as cursor:
                # By primary key: "id IN (subquery)" was planned as a scan of every collection's vectors.
                cursor.execute(
                    f"""
                    DELETE FROM kb_embedding WHERE id = ANY(ARRAY(
                        SELECT e.id FROM kb_embedding AS e JOIN kb_collection AS c ON c.id = e.collection_id
                        WHERE e.model_id = %(model)s AND e.collection_id = %(collection)s {document_chunks}
                          AND c.embedding_model_id <> %(model)s
                          AND c.next_embedding_model_id IS DISTINCT FROM %(model)s
                        LIMIT %(batch)s
                        FOR KEY SHARE OF c
                    ))
                    """,
                    {"model": model_id, "collection": collection_id, "doc": doc_id, "batch": PRUNE_BATCH_SIZE},
                )
                batch = cursor.rowcount
            deleted += batch
            if batch < PRUNE_BATCH_SIZE:
                break
    return deleted


def refresh_embedded_counts(collection: Collection, documents: QuerySet[Document]) -> None:
    counts = (
        Embedding.objects.filter(chunk__document=OuterRef("pk"), model_id=collection.embedding_model_id)
        .order_by()
        .values("chunk__document")
        .annotate(total=Count("*"))
        .values("total")
    )
    documents.update(embedded_count=Coalesce(Subquery(counts), 0))


def _finish(doc_id: str, collection: Collection) -> str | None:
    """Mark the document ready if every chunk has a vector of the collection's model; None if the
    collection searches with another model than the one it was embedded with (a switch finished
    meanwhile: chunks added since then had been embedded with the old model and the document marked
    ready, found by no semantic search). Vectors written meanwhile for a model the collection no
    longer uses are deleted."""
    with transaction.atomic():
        try:
            document = document_lock(doc_id=doc_id)
        except KBError:
            return "deleted"
        now = document.collection
        if (now.embedding_model_id, now.next_embedding_model_id) != (
            collection.embedding_model_id,
            collection.next_embedding_model_id,
        ):
            vectors_prune(collection_id=now.pk, doc_id=doc_id)
        if now.embedding_model_id != collection.embedding_model_id:
            return None
        refresh_embedded_counts(document.collection, Document.objects.filter(pk=doc_id))
        document.refresh_from_db(fields=["embedded_count", "chunk_count"])
        if document.embedded_count < document.chunk_count:
            # The content changed while we embedded: its new chunks have their own message.
            return document.status
        document.status = DocumentStatus.READY
        document.lease_expires_at = None
        document.error = document.error_code = ""
        document.save(update_fields=["status", "lease_expires_at", "error", "error_code", "updated_at"])
    return DocumentStatus.READY


def documents_embed_for_writer(*, documents: Sequence[Document], timeout: float | None = None) -> bool:
    """A writer who waits for its own documents to be searchable by meaning (an agent's note, REST
    ``wait``): the small ones (the interactive lane's) nobody has taken yet are embedded here and
    now, by the writer's own thread, instead of queueing for a worker's turn; then it waits for
    the rest, at most ``timeout`` (KB_WRITE_WAIT_SECONDS). True when none is still waiting.

    Their queued message stays: whichever takes a document first embeds it, and whatever fails
    here (a provider error, the database) is left to that message and its retries."""
    timeout = settings.KB_WRITE_WAIT_SECONDS if timeout is None else timeout
    deadline = time.monotonic() + timeout
    for document in documents:
        # Many files of one upload: what the wait leaves no time for is left to the workers.
        if time.monotonic() >= deadline:
            break
        if document.status == DocumentStatus.PENDING and is_interactive(document.chunk_count):
            _embed_here(document.pk)
    return wait_until_searchable(documents, timeout=max(0.0, deadline - time.monotonic()))


def _embed_here(doc_id: str) -> None:
    # The write has committed: a database error from here on (the claim included) must not make
    # its caller report the write as failed. The queued message embeds the document instead.
    try:
        claimed = document_claim(doc_id=doc_id)
    except DatabaseError:
        logger.warning("claiming %s for its writer failed, left to the worker", doc_id, exc_info=True)
        return
    if not claimed:
        return  # a worker has it
    keeper = document_lease_keeper(doc_id=doc_id)
    keeper.start()
    try:
        document_embed(doc_id=doc_id)
    except EmbeddingError as error:  # released back to pending: the queued message retries it
        logger.warning("embedding %s for its writer failed, left to the worker: %s", doc_id, error.message)
    except DatabaseError:
        logger.warning("embedding %s for its writer failed, left to the worker", doc_id, exc_info=True)
    finally:
        keeper.stop()


def document_release(*, doc_id: str, error: EmbeddingError) -> None:
    """Give a claimed document back after a provider failure; the task decides on retrying."""
    Document.objects.filter(pk=doc_id, status=DocumentStatus.PROCESSING).update(
        status=DocumentStatus.PENDING,
        error_code=ErrorCode.EMBEDDING_ERROR,
        error=f"{error.message} (will retry)" if error.retryable else error.message,
        lease_expires_at=pending_requeue_deadline(),
        updated_at=timezone.now(),
    )


def document_fail(*, doc_id: str, error: KBError) -> None:
    Document.objects.filter(pk=doc_id).exclude(status=DocumentStatus.READY).update(
        status=DocumentStatus.FAILED,
        error_code=error.code,
        error=error.message,
        lease_expires_at=None,
        updated_at=timezone.now(),
    )


def documents_needing_embedding(*, limit: int = 1000) -> list[str]:
    """Pending or processing documents whose message was lost or whose worker died.

    They are pending again (a dead worker's document is nobody's: any worker may claim it at
    once) with their requeue deadline pushed forward, so that one sweep sends one message each.
    Pushed for pending documents only, a dead worker's document had been sent again by every
    sweep of every worker until one was consumed, and one left processing without a lease
    (which no claim takes) forever.
    """
    now = timezone.now()
    stale = Q(status__in=[DocumentStatus.PENDING, DocumentStatus.PROCESSING]) & (
        Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True)
    )
    with transaction.atomic():
        ids = list(
            Document.objects.filter(stale)
            .select_for_update(skip_locked=True)
            .order_by("updated_at")
            .values_list("id", flat=True)[:limit]
        )
        Document.objects.filter(pk__in=ids).update(
            status=DocumentStatus.PENDING, lease_expires_at=pending_requeue_deadline()
        )
    return ids


def document_reembed(*, doc_id: str) -> Document:
    """Drop a document's vectors of the collection's model and embed it again."""
    with transaction.atomic():
        document = document_lock(doc_id=doc_id)
        Embedding.objects.filter(chunk__document=document, model_id=document.collection.embedding_model_id).delete()
        document.embedded_count = 0
        document.save(update_fields=["embedded_count"])
        return document_requeue_locked(document)
