"""Where ingestion stands: for agents and scripts that wait for documents to become searchable."""

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Count

from kb.errors import ErrorCode, KBError
from kb.models import Collection, Document, DocumentStatus

UNFINISHED = (DocumentStatus.PENDING, DocumentStatus.PROCESSING)


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
        found = list(documents.filter(pk__in=list(doc_ids)))
        missing = sorted(set(doc_ids) - {document.pk for document in found})
        if missing:
            raise KBError(ErrorCode.DOCUMENT_NOT_FOUND, f"Document not found: {', '.join(missing)}")
        return IngestionStatus(documents=found, counts=_counts(found))
    in_collection = documents.filter(collection=collection)
    totals = dict(in_collection.order_by().values_list("status").annotate(n=Count("pk")))
    listed = list(in_collection.exclude(status=DocumentStatus.READY).order_by("created_at")[:limit])
    return IngestionStatus(documents=listed, counts={status: totals.get(status, 0) for status in DocumentStatus.values})


def _counts(documents: Sequence[Document]) -> dict[str, int]:
    counts = dict.fromkeys(DocumentStatus.values, 0)
    for document in documents:
        counts[document.status] += 1
    return counts
