"""Totals of the whole knowledge base or of one collection, and its size on disk."""

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce
from pydantic import BaseModel, ConfigDict, Field

from kb.models import Collection, Document, DocumentStatus, Embedding
from kb.replicas import read_connection, reads_from_replica
from kb.selectors.collections import collection_get

KB_TABLES = (
    "kb_collection",
    "kb_document",
    "kb_chunk",
    "kb_embedding",
    "kb_embeddingmodel",
    "kb_posting",
    "kb_term_stats",
)


class Stats(BaseModel):
    """The one shape of the statistics: REST ``/api/stats``, MCP ``rag_stats``, ``kb_stats --json``."""

    model_config = ConfigDict(frozen=True)

    collections: int
    documents: int
    chunks: int
    embeddings: int
    storage_bytes: int
    filter: str | None = Field(description="The collection counted, or null for all of them")
    pending: int
    processing: int
    failed: int


@reads_from_replica
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
        storage_bytes=storage_bytes() if collection is None else collection_storage_bytes(target.pk),
        filter=collection,
        pending=totals["pending"],
        processing=totals["processing"],
        failed=totals["failed"],
    )


def collection_storage_bytes(collection_id: int) -> int:
    """Bytes one collection's content takes as stored (compressed where Postgres compressed it):
    its documents' text and metadata, its chunks' text, keyword index and metadata, its vectors.
    Sizes are read from the rows and TOAST pointers without reading the text itself. Never the
    database's size, which would tell a token limited to this collection how much the others hold."""
    with read_connection().cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(pg_column_size(raw_content) + pg_column_size(metadata)), 0)"
            "        FROM kb_document WHERE collection_id = %s)"
            " + (SELECT coalesce(sum(pg_column_size(content) + pg_column_size(search_vector)"
            "        + pg_column_size(metadata)), 0) FROM kb_chunk WHERE collection_id = %s)"
            " + (SELECT coalesce(sum(pg_column_size(vector)), 0) FROM kb_embedding WHERE collection_id = %s)",
            [collection_id] * 3,
        )
        return int(cursor.fetchone()[0])


def storage_bytes() -> int:
    """Bytes on disk of the knowledge base's tables with their indexes and TOAST data."""
    with read_connection().cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relname = ANY(%s) AND c.relkind = 'r'",
            [list(KB_TABLES)],
        )
        return int(cursor.fetchone()[0])
