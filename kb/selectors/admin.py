"""Read-only queries behind the admin's own pages: the dashboard, live status, delete
confirmations, the chunks of a document and the playground's highlighted matches.

Every query here is bounded (a page of rows, a fixed number of days) and never loads the
heavy columns: a document's raw content, a chunk's ``search_vector``, an embedding's vector.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, Left, TruncDate
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from kb.models import Chunk, Document, DocumentStatus, Embedding, IngestRefusal
from kb.selectors.stats import Stats, kb_stats

# Columns of a document that lists and status polls need; never raw_content or metadata.
DOCUMENT_SUMMARY_FIELDS = (
    "id",
    "title",
    "source_uri",
    "content_type",
    "status",
    "error_code",
    "error",
    "chunk_count",
    "embedded_count",
    "size_bytes",
    "created_at",
    "updated_at",
    "collection__id",
    "collection__name",
)
# Enough ids for a page of the document list; a poll asking for more is cut to this.
MAX_STATUS_IDS = 500


@dataclass(frozen=True)
class DayCount:
    day: date
    documents: int


@dataclass(frozen=True)
class Dashboard:
    stats: Stats
    recent: list[Document]
    failed: list[Document]
    refused: list[IngestRefusal]
    per_day: list[DayCount]

    @property
    def per_day_max(self) -> int:
        return max((day.documents for day in self.per_day), default=0)


def document_summaries() -> QuerySet[Document]:
    return Document.objects.select_related("collection").only(*DOCUMENT_SUMMARY_FIELDS)


def dashboard(*, recent: int = 8, failed: int = 5, days: int = 14) -> Dashboard:
    return Dashboard(
        stats=kb_stats(),
        recent=list(document_summaries().order_by("-created_at")[:recent]),
        failed=list(document_summaries().filter(status=DocumentStatus.FAILED).order_by("-updated_at")[:failed]),
        refused=list(IngestRefusal.objects.select_related("collection")[:failed]),
        per_day=documents_per_day(days=days),
    )


def documents_per_day(*, days: int) -> list[DayCount]:
    """Documents created on each of the last ``days`` days (today included), zeros filled in."""
    today = timezone.localdate()
    first = today - timedelta(days=days - 1)
    start = timezone.make_aware(timezone.datetime.combine(first, timezone.datetime.min.time()))
    rows = (
        Document.objects.filter(created_at__gte=start)
        .annotate(day=TruncDate("created_at", tzinfo=timezone.get_current_timezone()))
        .order_by()
        .values("day")
        .annotate(total=Count("pk"))
    )
    counts = {row["day"]: row["total"] for row in rows}
    return [DayCount(day=day, documents=counts.get(day, 0)) for day in (first + timedelta(n) for n in range(days))]


def document_statuses(*, ids: Iterable[str]) -> list[dict[str, Any]]:
    """Status and embedding progress of the given documents, for the admin's polling."""
    wanted = list(dict.fromkeys(str(doc_id) for doc_id in ids))[:MAX_STATUS_IDS]
    rows = Document.objects.filter(pk__in=wanted).values(
        "id", "status", "error_code", "error", "chunk_count", "embedded_count"
    )
    labels = dict(DocumentStatus.choices)
    return [{**row, "label": labels.get(row["status"], row["status"])} for row in rows]


def ingestion_queue() -> dict[str, int]:
    """Documents waiting for, being given, or having failed their embeddings."""
    waiting = (DocumentStatus.PENDING, DocumentStatus.PROCESSING, DocumentStatus.FAILED)
    totals = Document.objects.filter(status__in=waiting).aggregate(
        **{str(status): Count("pk", filter=Q(status=status)) for status in waiting}
    )
    return {key: value or 0 for key, value in totals.items()}


@dataclass(frozen=True)
class Removal:
    """What deleting some collections or documents takes with it (the database cascades it)."""

    documents: int
    chunks: int
    embeddings: int


def collections_removal(*, collection_ids: Sequence[int]) -> Removal:
    documents = Document.objects.filter(collection_id__in=collection_ids).aggregate(
        documents=Count("pk"), chunks=Coalesce(Sum("chunk_count"), 0)
    )
    embeddings = Embedding.objects.filter(collection_id__in=collection_ids).count()
    return Removal(documents=documents["documents"], chunks=documents["chunks"], embeddings=embeddings)


def documents_removal(*, document_ids: Sequence[str]) -> Removal:
    chunks = Chunk.objects.filter(document_id__in=document_ids).count()
    embeddings = Embedding.objects.filter(chunk__document_id__in=document_ids).count()
    return Removal(documents=len(document_ids), chunks=chunks, embeddings=embeddings)


def document_chunk_rows(*, document: Document, limit: int) -> list[Chunk]:
    """The first chunks of a document, each with ``embedded``: whether it has a vector of the
    collection's current model. The text is cut to a preview; vectors are never read."""
    embedded = Embedding.objects.filter(chunk=OuterRef("pk"), model_id=document.collection.embedding_model_id)
    return list(
        Chunk.objects.filter(document=document)
        .only("id", "index", "line_start", "line_end", "page", "token_count")
        .annotate(embedded=Exists(embedded), preview=Left("content", 160))
        .order_by("index")[:limit]
    )


# Private-use characters as ts_headline's markers: they cannot clash with HTML or the text.
_MARK_START, _MARK_STOP = "\ue000", "\ue001"
HIGHLIGHTED_CHARS = 3000


def chunk_highlights(*, query: str, chunk_ids: Sequence[int]) -> dict[int, SafeString]:
    """Each chunk's text, HTML-escaped, with the words matching the query in ``<mark>``: its first
    HIGHLIGHTED_CHARS characters (a page of a hundred 8,192-token chunks had been 11 MB)."""
    if not chunk_ids:
        return {}
    options = f'StartSel="{_MARK_START}", StopSel="{_MARK_STOP}", HighlightAll=true'
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, ts_headline('english', left(content, %s), plainto_tsquery('english', %s), %s), "
            "length(content) FROM kb_chunk WHERE id = ANY(%s)",
            [HIGHLIGHTED_CHARS, query, options, list(chunk_ids)],
        )
        rows = cursor.fetchall()
    return {
        chunk_id: mark_safe(  # escaped first: only our markers become tags
            escape(text).replace(_MARK_START, "<mark>").replace(_MARK_STOP, "</mark>")
            + (f" … [{length - HIGHLIGHTED_CHARS} more characters]" if length > HIGHLIGHTED_CHARS else "")
        )
        for chunk_id, text, length in rows
    }
