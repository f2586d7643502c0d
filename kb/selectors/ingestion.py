"""Where ingestion stands: for agents and scripts that wait for documents to become searchable."""

import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count

from kb.errors import ErrorCode, KBError
from kb.models import Collection, Document, DocumentStatus

UNFINISHED = (DocumentStatus.PENDING, DocumentStatus.PROCESSING)
# Documents one status call may follow: a door checks the caller's access to each of them.
MAX_STATUS_DOCUMENTS = 1000


@dataclass(frozen=True)
class IngestionStatus:
    # The documents asked for; for a collection, its unfinished and failed ones (at most `limit`).
    documents: list[Document]
    counts: dict[str, int]

    @property
    def done(self) -> bool:
        return not any(self.counts[status] for status in UNFINISHED)


def ingestion_status(
    *, doc_ids: Sequence[str] | None = None, collection: Collection | None = None, limit: int = 100
) -> IngestionStatus:
    """The status of some documents, or of a whole collection. Unknown ids are DOCUMENT_NOT_FOUND."""
    if (doc_ids is None) == (collection is None):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "Give either document ids or a collection")
    documents = Document.objects.select_related("collection").defer("raw_content")
    if doc_ids is not None:
        doc_ids = status_doc_ids(doc_ids)
        found = list(documents.filter(pk__in=doc_ids))
        missing = sorted(set(doc_ids) - {document.pk for document in found})
        if missing:
            raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {', '.join(missing)}")
        return IngestionStatus(documents=found, counts=_counts(found))
    in_collection = documents.filter(collection=collection)
    totals = dict(in_collection.order_by().values_list("status").annotate(n=Count("pk")))
    listed = list(in_collection.exclude(status=DocumentStatus.READY).order_by("created_at")[:limit])
    return IngestionStatus(documents=listed, counts={status: totals.get(status, 0) for status in DocumentStatus.values})


def status_doc_ids(doc_ids: Sequence[str]) -> list[str]:
    """The documents a status call follows, each once; at most MAX_STATUS_DOCUMENTS of them."""
    unique = list(dict.fromkeys(doc_ids))
    if len(unique) > MAX_STATUS_DOCUMENTS:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"At most {MAX_STATUS_DOCUMENTS} document ids per status call")
    return unique


def _counts(documents: Sequence[Document]) -> dict[str, int]:
    counts = dict.fromkeys(DocumentStatus.values, 0)
    for document in documents:
        counts[document.status] += 1
    return counts


POLL_SECONDS = 0.05
STILL_EMBEDDING = (
    "Embedding continues: keyword search finds it now, search by meaning once its status is "
    "'ready' (rag_ingestion_status on the default /mcp, or GET /api/documents/{id}, shows it)."
)


def wait_until_searchable(documents: Sequence[Document], *, timeout: float | None = None) -> bool:
    """Wait until every document is embedded (ready) or failed, at most ``timeout`` seconds
    (KB_WRITE_WAIT_SECONDS by default), for writers who search right after writing. The documents
    are refreshed in place; True when none is still waiting. Embedding stays the worker's job."""
    deadline = time.monotonic() + (settings.KB_WRITE_WAIT_SECONDS if timeout is None else timeout)
    waiting = {document.pk: document for document in documents if document.status in UNFINISHED}
    while waiting:
        rows = Document.objects.filter(pk__in=list(waiting)).values(
            "pk", "status", "embedded_count", "error_code", "error"
        )
        found = {row.pop("pk"): row for row in rows}
        for doc_id in list(waiting):
            for name, value in found.get(doc_id, {"status": DocumentStatus.FAILED}).items():
                setattr(waiting[doc_id], name, value)
            if waiting[doc_id].status not in UNFINISHED:
                del waiting[doc_id]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    return not waiting


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
