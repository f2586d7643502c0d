"""The result shapes of the canonical server (rag-mcp, seed 001), as output schemas and builders.

Fields beyond the seed's are additions a client may ignore. Timestamps are Unix milliseconds.
"""

from datetime import datetime
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from typing_extensions import TypedDict

from kb.models import Chunk, Collection, Document
from kb.search import SearchResponse, SearchResult
from kb.selectors.collections import collection_reembedding
from kb.services.ingest import UPLOAD_PREFIX, IngestItem, IngestReport


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def file_name(source_uri: str) -> str:
    """The file name in a source URI or path (the seeds that speak of files show only the name).
    An upload's URI holds its name whole, where a URL parser sees a host."""
    if source_uri.startswith(UPLOAD_PREFIX):
        return source_uri.removeprefix(UPLOAD_PREFIX) or source_uri
    path = unquote(urlsplit(source_uri).path) if "://" in source_uri else source_uri
    return PurePosixPath(path).name or source_uri


class HitMetadata(TypedDict):
    lines: str
    tokens: int
    chunk_index: int
    page: int | None
    heading_path: list[str]
    content_type: str
    title: str
    document: dict[str, Any]


class SearchHit(TypedDict):
    rank: int
    score: float
    fused_score: float | None
    similarity: float | None
    keyword_score: float | None
    vector_rank: int | None
    keyword_rank: int | None
    source: str
    source_uri: str
    collection: str
    content: str
    content_truncated: bool
    metadata: HitMetadata
    document_hits: int | None


class SearchOutput(TypedDict):
    query: str
    mode: str
    semantic_weight: float
    total_results: int
    results: list[SearchHit]
    truncated: bool
    warnings: list[str]


def search_hit(result: SearchResult) -> SearchHit:
    return SearchHit(
        rank=result.rank,
        score=result.score,
        fused_score=result.fused_score,
        similarity=result.similarity,
        keyword_score=result.keyword_score,
        vector_rank=result.vector_rank,
        keyword_rank=result.keyword_rank,
        source=result.document_id,
        source_uri=result.source_uri,
        collection=result.collection,
        content=result.content,
        content_truncated=False,
        document_hits=result.document_hits,
        metadata=HitMetadata(
            lines=result.lines,
            tokens=result.token_count,
            chunk_index=result.chunk_index,
            page=result.page,
            heading_path=result.heading_path,
            content_type=result.content_type,
            title=result.title,
            document=result.metadata,
        ),
    )


def search_output(response: SearchResponse) -> SearchOutput:
    hits = [search_hit(result) for result in response.results]
    return SearchOutput(
        query=response.query,
        mode=response.mode,
        semantic_weight=response.semantic_weight,
        total_results=len(hits),
        results=hits,
        truncated=False,
        warnings=list(response.warnings),
    )


class ChunkOutput(TypedDict):
    index: int
    content: str
    tokens: int
    lines: str
    page: int | None
    heading_path: list[str]


def chunk_output(chunk: Chunk) -> ChunkOutput:
    return ChunkOutput(
        index=chunk.index,
        content=chunk.content,
        tokens=chunk.token_count,
        lines=chunk.lines,
        page=chunk.page,
        heading_path=chunk.heading_path,
    )


class CollectionSummary(TypedDict):
    name: str
    description: str
    created_at: int
    uuid: str
    documents: int
    chunks: int
    pending: int
    processing: int
    failed: int
    reembedding: str | None


def collection_summary(collection: Collection) -> CollectionSummary:
    """A collection annotated by kb.selectors.collection_list."""
    return CollectionSummary(
        name=collection.name,
        description=collection.description,
        created_at=millis(collection.created_at),
        uuid=str(collection.uuid),
        documents=collection.document_total,
        chunks=collection.chunk_total,
        pending=collection.pending_total,
        processing=collection.processing_total,
        failed=collection.failed_total,
        reembedding=_reembedding(collection),
    )


def _reembedding(collection: Collection) -> str | None:
    reembedding = collection_reembedding(collection=collection)
    return reembedding.summary if reembedding else None


def collection_settings(collection: Collection) -> dict[str, Any]:
    weight = collection.semantic_weight if collection.semantic_weight is not None else settings.KB_SEMANTIC_WEIGHT
    return {
        "chunking": {
            "max_tokens": collection.chunk_max_tokens,
            "min_tokens": collection.chunk_min_tokens,
            "overlap_tokens": collection.chunk_overlap_tokens,
        },
        "search": {"top_k": collection.search_top_k, "hybrid": collection.search_hybrid, "hybrid_alpha": weight},
        "embedding_model": str(collection.embedding_model),
        "reembedding": _reembedding(collection),
    }


class DocumentSummary(TypedDict):
    id: str
    source_uri: str
    content_type: str
    title: str
    status: str
    chunk_count: int
    created_at: int
    updated_at: int


def document_summary(document: Document) -> DocumentSummary:
    return DocumentSummary(
        id=document.pk,
        source_uri=document.source_uri,
        content_type=document.content_type,
        title=document.title,
        status=document.status,
        chunk_count=document.chunk_count,
        created_at=millis(document.created_at),
        updated_at=millis(document.updated_at),
    )


class DocumentProgress(TypedDict):
    id: str
    collection: str
    source_uri: str
    status: str
    chunk_count: int
    embedded_count: int
    error_code: str
    error: str


def document_progress(document: Document) -> DocumentProgress:
    return DocumentProgress(
        id=document.pk,
        collection=document.collection.name,
        source_uri=document.source_uri,
        status=document.status,
        chunk_count=document.chunk_count,
        embedded_count=document.embedded_count,
        error_code=document.error_code,
        error=document.error,
    )


class DocumentDetail(DocumentProgress):
    content_type: str
    title: str
    size_bytes: int
    metadata: dict[str, Any]
    created_at: int
    updated_at: int


def document_detail(document: Document) -> DocumentDetail:
    return DocumentDetail(
        **document_progress(document),
        content_type=document.content_type,
        title=document.title,
        size_bytes=document.size_bytes,
        metadata=document.metadata,
        created_at=millis(document.created_at),
        updated_at=millis(document.updated_at),
    )


class IngestedDocument(TypedDict):
    doc_id: str | None
    source_uri: str
    outcome: str
    content_type: str | None
    status: str | None
    chunks_created: int
    chunks_reused: int
    error: dict[str, str] | None


class IngestOutput(TypedDict):
    success: bool
    doc_id: str | None
    collection: str
    source_uri: str
    content_type: str | None
    chunks_created: int
    outcome: str
    status: str | None
    documents: list[IngestedDocument]
    failed: int
    skipped: int  # files of a folder whose type is not supported
    # Set when the answer came before the chunks were searchable by meaning (KB_WRITE_WAIT_SECONDS).
    note: str | None


def ingested_document(item: IngestItem) -> IngestedDocument:
    document = item.document
    return IngestedDocument(
        doc_id=document.pk if document else None,
        source_uri=item.source_uri,
        outcome=item.outcome,
        content_type=document.content_type if document else None,
        status=document.status if document else None,
        # An unchanged source is a no-op: nothing was chunked again.
        chunks_created=document.chunk_count if document and item.outcome != "unchanged" else 0,
        chunks_reused=item.chunks_reused,
        error=item.error.as_dict()["error"] if item.error else None,
    )


def ingest_output(*, collection: str, uri: str, report: IngestReport, note: str | None = None) -> IngestOutput:
    """One source gives that document's fields; a directory gives totals and one entry per file."""
    documents = [ingested_document(item) for item in report.items]
    single = documents[0] if len(documents) == 1 else None
    return IngestOutput(
        success=not report.failed,
        doc_id=single["doc_id"] if single else None,
        collection=collection,
        source_uri=single["source_uri"] if single else uri,
        content_type=single["content_type"] if single else None,
        chunks_created=sum(document["chunks_created"] for document in documents),
        outcome=single["outcome"] if single else "directory",
        status=single["status"] if single else None,
        documents=documents,
        failed=len(report.failed),
        skipped=report.count("skipped"),
        note=note,
    )
