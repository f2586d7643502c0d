"""Reads of the knowledge base, shared by every front door."""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from kb.errors import ErrorCode, KBError
from kb.models import ApiToken, Chunk, Collection, Document, DocumentStatus, Embedding

KB_TABLES = (
    "kb_collection",
    "kb_document",
    "kb_chunk",
    "kb_embedding",
    "kb_embeddingmodel",
    "kb_posting",
    "kb_term_stats",
)


def collection_get(*, name: str) -> Collection:
    try:
        return Collection.objects.select_related("embedding_model", "next_embedding_model").get(name=name)
    except Collection.DoesNotExist:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}") from None


@dataclass(frozen=True)
class Reembedding:
    """A model switch under way: how far it is, and why it cannot go on if it cannot."""

    model: str
    done: int
    total: int
    state: str  # "running", "retrying" (an error, will try again) or "stopped" (retry or cancel)
    error: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def summary(self) -> str:
        text = f"re-embedding with {self.model}: {self.done} of {self.total} chunks"
        if self.state == "stopped":
            return f"{text}; stopped: {self.error} (retry or cancel it: admin, REST API or kb_reembed)"
        if self.state == "retrying":
            return f"{text}; retrying after: {self.error}"
        return text


def collection_reembedding(*, collection: Collection) -> Reembedding | None:
    if not collection.next_embedding_model_id:
        return None
    total = Chunk.objects.filter(collection=collection).count()
    done = Embedding.objects.filter(collection=collection, model_id=collection.next_embedding_model_id).count()
    state = "retrying" if collection.reembed_error else "running"
    if collection.reembed_stopped_at:
        state = "stopped"
    return Reembedding(
        model=str(collection.next_embedding_model), done=done, total=total, state=state, error=collection.reembed_error
    )


def collection_get_by_uuid(*, collection_uuid: str) -> Collection:
    try:
        parsed = uuid.UUID(str(collection_uuid))
    except ValueError:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Not a collection UUID: {collection_uuid}") from None
    try:
        return Collection.objects.select_related("embedding_model").get(uuid=parsed)
    except Collection.DoesNotExist:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection_uuid}") from None


def collection_list() -> QuerySet[Collection]:
    """Collections with their document counts per status and chunk totals (one query)."""
    return (
        Collection.objects.select_related("embedding_model", "next_embedding_model")
        .annotate(
            document_total=Count("documents"),
            chunk_total=Coalesce(Sum("documents__chunk_count"), 0),
            pending_total=Count("documents", filter=Q(documents__status=DocumentStatus.PENDING)),
            processing_total=Count("documents", filter=Q(documents__status=DocumentStatus.PROCESSING)),
            ready_total=Count("documents", filter=Q(documents__status=DocumentStatus.READY)),
            failed_total=Count("documents", filter=Q(documents__status=DocumentStatus.FAILED)),
        )
        .order_by("name")
    )


def document_get(*, doc_id: str) -> Document:
    try:
        return Document.objects.select_related("collection").get(pk=doc_id)
    except Document.DoesNotExist:
        raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {doc_id}") from None


# Offsets beyond this cannot page anywhere useful and would overflow Postgres' bigint.
MAX_OFFSET = 1_000_000_000


def document_list(
    *, collection: Collection, limit: int = 100, offset: int = 0, status: str | None = None
) -> list[Document]:
    if not 1 <= limit <= 1000:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "limit must be between 1 and 1000")
    if not 0 <= offset <= MAX_OFFSET:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"offset must be between 0 and {MAX_OFFSET}")
    documents = Document.objects.filter(collection=collection).defer("raw_content").order_by("created_at", "id")
    if status:
        if status not in DocumentStatus.values:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"status must be one of {', '.join(DocumentStatus.values)}")
        documents = documents.filter(status=status)
    return list(documents[offset : offset + limit])


def document_chunks(*, document: Document) -> QuerySet[Chunk]:
    return Chunk.objects.filter(document=document).defer("search_vector").order_by("index")


MAX_NEIGHBORS = 10


def chunk_neighbors(*, document: Document, chunk_index: int, before: int = 1, after: int = 1) -> list[Chunk]:
    """A chunk of ``document`` and up to ``before``/``after`` chunks on each side of it, in order:
    the text around a search hit, without fetching the whole document."""
    for name, count in (("before", before), ("after", after)):
        if not 0 <= count <= MAX_NEIGHBORS:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"{name} must be between 0 and {MAX_NEIGHBORS}")
    if not 0 <= chunk_index <= MAX_OFFSET:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"chunk_index must be between 0 and {MAX_OFFSET}")
    ordered = document_chunks(document=document)
    hit = ordered.filter(index=chunk_index).first()
    if hit is None:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Document {document.id} has no chunk {chunk_index} (it has {document.chunk_count} chunks)",
        )
    # By position, not index arithmetic: chunks stored by a client may skip indices.
    preceding = list(ordered.filter(index__lt=chunk_index).order_by("-index")[:before]) if before else []
    following = list(ordered.filter(index__gt=chunk_index)[:after]) if after else []
    return [*reversed(preceding), hit, *following]


@dataclass(frozen=True)
class Stats:
    collections: int
    documents: int
    chunks: int
    embeddings: int
    storage_bytes: int
    filter: str | None
    pending: int
    processing: int
    failed: int

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def kb_stats(*, collection: str | None = None) -> Stats:
    documents = Document.objects.all()
    embeddings = Embedding.objects.all()
    collections = Collection.objects.all()
    if collection is not None:
        target = collection_get(name=collection)
        documents = documents.filter(collection=target)
        embeddings = embeddings.filter(collection=target, model_id=target.embedding_model_id)
        collections = collections.filter(pk=target.pk)
    totals = documents.aggregate(
        documents=Count("pk"),
        chunks=Coalesce(Sum("chunk_count"), 0),
        pending=Count("pk", filter=Q(status=DocumentStatus.PENDING)),
        processing=Count("pk", filter=Q(status=DocumentStatus.PROCESSING)),
        failed=Count("pk", filter=Q(status=DocumentStatus.FAILED)),
    )
    return Stats(
        collections=collections.count(),
        documents=totals["documents"],
        chunks=totals["chunks"],
        embeddings=embeddings.count(),
        storage_bytes=storage_bytes(),
        filter=collection,
        pending=totals["pending"],
        processing=totals["processing"],
        failed=totals["failed"],
    )


def storage_bytes() -> int:
    """Bytes on disk of the knowledge base's tables with their indexes and TOAST data."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relname = ANY(%s) AND c.relkind = 'r'",
            [list(KB_TABLES)],
        )
        return int(cursor.fetchone()[0])


def health_report(*, detailed: bool) -> dict[str, Any]:
    """Database, broker and embedding providers (see kb.health)."""
    from kb.health import health_report as report

    return report(detailed=detailed)


def ready() -> bool:
    """Database, broker and a worker on every queue (see kb.health)."""
    from kb.health import ready as is_ready

    return is_ready()


def collection_get_with_totals(*, name: str) -> Collection:
    """One collection with the annotations of ``collection_list``."""
    collection = collection_list().filter(name=name).first()
    if collection is None:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {name}")
    return collection


@dataclass(frozen=True)
class EmbeddingProgress:
    """How far the embedding of some documents got; deleted documents count as finished."""

    documents: int
    finished: int
    chunks: int
    embedded_chunks: int
    failed: list[Document]

    @property
    def done(self) -> bool:
        return self.finished >= self.documents


def documents_embedding_progress(*, doc_ids: Sequence[str]) -> EmbeddingProgress:
    documents = list(
        Document.objects.filter(pk__in=list(doc_ids)).only(
            "id", "source_uri", "status", "error_code", "error", "chunk_count", "embedded_count"
        )
    )
    settled = (DocumentStatus.READY, DocumentStatus.FAILED)
    return EmbeddingProgress(
        documents=len(set(doc_ids)),
        finished=len(set(doc_ids)) - len(documents) + sum(1 for doc in documents if doc.status in settled),
        chunks=sum(doc.chunk_count for doc in documents),
        embedded_chunks=sum(min(doc.embedded_count, doc.chunk_count) for doc in documents),
        failed=[doc for doc in documents if doc.status == DocumentStatus.FAILED],
    )


def token_list() -> QuerySet[ApiToken]:
    return ApiToken.objects.select_related("created_by").prefetch_related("collections").order_by("-created_at")
