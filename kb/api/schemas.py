"""Request and response schemas of the REST API: one input and one output schema per endpoint.

Output schemas are built from what the services and selectors return (``Out.of(...)``); the
management commands print the same shapes with ``--json``.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any

from ninja import Path, Schema
from pydantic import ConfigDict, Field, Json, field_validator

from kb.ingestion.formats import CONTENT_TYPES
from kb.models import (
    CHUNK_MAX_TOKENS_RANGE,
    COLLECTION_NAME_MAX_LENGTH,
    COLLECTION_NAME_PATTERN,
    DEFAULT_CHUNK_MAX_TOKENS,
    DEFAULT_CHUNK_MIN_TOKENS,
    DEFAULT_CHUNK_OVERLAP_TOKENS,
    DEFAULT_TOP_K,
    EMBEDDING_MODEL_NAME_MAX_LENGTH,
    MAX_TOP_K,
    Chunk,
    Collection,
    Document,
    DocumentStatusName,
    ProviderName,
)
from kb.search import MAX_CANDIDATE_DEPTH, Mode
from kb.search.filters import MAX_FILTER_DOCUMENTS, MAX_FILTER_VALUES
from kb.selectors.collections import EmbeddingModelInfo, ReembedState, collection_reembedding
from kb.selectors.documents import DEFAULT_PAGE_SIZE, MAX_NEIGHBORS, MAX_OFFSET, MAX_PAGE_SIZE
from kb.selectors.health import HealthStatus
from kb.selectors.sources import SourceOut, SyncRunOut
from kb.services.documents import StoredDocument
from kb.services.ingest import IngestItem, IngestReport, ItemOutcome

CONTENT_TYPE_DESCRIPTION = f"Override the detected content type: {', '.join(CONTENT_TYPES)}"
ChunkMaxTokens = Annotated[int, Field(ge=CHUNK_MAX_TOKENS_RANGE[0], le=CHUNK_MAX_TOKENS_RANGE[1])]
ChunkMinTokens = Annotated[int, Field(ge=0, le=CHUNK_MAX_TOKENS_RANGE[1])]
ChunkOverlapTokens = Annotated[int, Field(ge=0, lt=CHUNK_MAX_TOKENS_RANGE[1] // 2)]
TopK = Annotated[int, Field(ge=1, le=MAX_TOP_K)]
# Names and ids looked up are the services' to judge: one that is no collection's (malformed too) is
# COLLECTION_NOT_FOUND at every door (REST had said INVALID_ARGUMENT, MCP COLLECTION_NOT_FOUND).
CollectionName = Annotated[str, Path(description="Collection name", example="docs")]
DocumentId = Annotated[str, Path(description="Document ID (ULID)", example="01HRE4KXQN8Z3J2X5Y7A9B4C6D")]


class InputSchema(Schema):
    # What the database can store is checked by the services (kb.storable), for every door alike.
    model_config = ConfigDict(extra="forbid")


class BodyInputSchema(InputSchema):
    """A JSON body: typed as JSON types it, so "5" is not 5, true is not 1 and "no" is not false
    (the MCP tools' JSON Schemas refuse them too). Query strings and forms stay text to convert."""

    model_config = ConfigDict(extra="forbid", strict=True)


# --- errors -----------------------------------------------------------------------------------


class ErrorDetail(Schema):
    code: str = Field(examples=["COLLECTION_NOT_FOUND"])
    message: str


class ErrorOut(Schema):
    error: ErrorDetail


# --- collections ------------------------------------------------------------------------------


class ChunkingSettings(Schema):
    max_tokens: int
    min_tokens: int
    overlap_tokens: int


class SearchSettings(Schema):
    top_k: int
    hybrid: bool
    semantic_weight: float | None = Field(description="None: the server default (KB_SEMANTIC_WEIGHT)")


class CollectionSettings(Schema):
    chunking: ChunkingSettings
    search: SearchSettings


class DocumentTotals(Schema):
    total: int
    pending: int
    processing: int
    ready: int
    failed: int


class ReembeddingOut(Schema):
    model: str = Field(description="The model the collection is being re-embedded with")
    done: int = Field(description="Chunks that have a vector of it")
    total: int
    state: ReembedState = Field(
        description="stopped: it will not go on by itself; POST .../reembed/retry or .../reembed/cancel"
    )
    error: str = Field(description="Why it is retrying or has stopped")


class CollectionOut(Schema):
    """A collection with its settings and totals (annotated by ``collection_get_with_totals``)."""

    name: str
    description: str
    uuid: str
    embedding_model: EmbeddingModelInfo
    next_embedding_model: EmbeddingModelInfo | None = Field(
        description="Set while the collection is re-embedded with another model; search switches when it is done"
    )
    reembedding: ReembeddingOut | None = Field(description="Progress of a model switch, and why it stopped if it did")
    settings: CollectionSettings
    documents: DocumentTotals
    chunks: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, collection: Collection) -> "CollectionOut":
        following = collection.next_embedding_model
        reembedding = collection_reembedding(collection=collection)
        return cls(
            reembedding=ReembeddingOut(**reembedding.as_dict()) if reembedding else None,
            name=collection.name,
            description=collection.description,
            uuid=str(collection.uuid),
            embedding_model=EmbeddingModelInfo.model_validate(collection.embedding_model),
            next_embedding_model=EmbeddingModelInfo.model_validate(following) if following else None,
            settings=CollectionSettings(
                chunking=ChunkingSettings(
                    max_tokens=collection.chunk_max_tokens,
                    min_tokens=collection.chunk_min_tokens,
                    overlap_tokens=collection.chunk_overlap_tokens,
                ),
                search=SearchSettings(
                    top_k=collection.search_top_k,
                    hybrid=collection.search_hybrid,
                    semantic_weight=collection.semantic_weight,
                ),
            ),
            documents=DocumentTotals(
                total=collection.document_total,
                pending=collection.pending_total,
                processing=collection.processing_total,
                ready=collection.ready_total,
                failed=collection.failed_total,
            ),
            chunks=collection.chunk_total,
            created_at=collection.created_at,
            updated_at=collection.updated_at,
        )


class CollectionCreateIn(BodyInputSchema):
    name: str = Field(pattern=COLLECTION_NAME_PATTERN, max_length=COLLECTION_NAME_MAX_LENGTH, examples=["docs"])
    description: str = Field("", description="At most KB_MAX_DESCRIPTION_CHARS (2,000) characters")
    embedding_provider: ProviderName | None = Field(None, description="Default: EMBEDDING_PROVIDER")
    embedding_model: str | None = Field(
        None, max_length=EMBEDDING_MODEL_NAME_MAX_LENGTH, description="Default: the provider's default model"
    )
    chunk_max_tokens: ChunkMaxTokens = DEFAULT_CHUNK_MAX_TOKENS
    chunk_min_tokens: ChunkMinTokens = DEFAULT_CHUNK_MIN_TOKENS
    chunk_overlap_tokens: ChunkOverlapTokens = DEFAULT_CHUNK_OVERLAP_TOKENS
    search_top_k: TopK = DEFAULT_TOP_K
    search_hybrid: bool = Field(True, description="False: search this collection by keyword unless asked otherwise")
    semantic_weight: float | None = Field(None, ge=0.0, le=1.0, description="Hybrid fusion weight; None: default")


class CollectionUpdateIn(BodyInputSchema):
    """Only the fields given change. A new embedding model is filled in the background."""

    description: str | None = Field(None, description="At most KB_MAX_DESCRIPTION_CHARS (2,000) characters")
    chunk_max_tokens: ChunkMaxTokens | None = None
    chunk_min_tokens: ChunkMinTokens | None = None
    chunk_overlap_tokens: ChunkOverlapTokens | None = None
    search_top_k: TopK | None = None
    search_hybrid: bool | None = None
    semantic_weight: float | None = Field(None, ge=0.0, le=1.0)
    clear_semantic_weight: bool = Field(False, description="Go back to the server default weight")
    embedding_provider: ProviderName | None = Field(None, description="Re-embed with this provider's model")
    embedding_model: str | None = Field(
        None, min_length=1, max_length=EMBEDDING_MODEL_NAME_MAX_LENGTH, description="Re-embed with this model"
    )


class CollectionDeleteQuery(InputSchema):
    confirm: bool = Field(False, description="Must be true: deleting a collection deletes all its documents")

    @field_validator("confirm", mode="before")
    @classmethod
    def _only_true(cls, value: Any) -> Any:
        # Not pydantic's lax booleans: "yes", "on", "1" or "t" must not delete everything.
        if isinstance(value, str) and value.lower() not in ("true", "false"):
            raise ValueError("confirm must be true or false")
        return value


class CollectionDeletedOut(Schema):
    success: bool
    name: str
    documents: int
    chunks: int


# --- documents --------------------------------------------------------------------------------


class DocumentListQuery(InputSchema):
    limit: int = Field(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)
    status: DocumentStatusName | None = None


class DocumentSummaryOut(Schema):
    id: str
    collection: str
    source_uri: str
    content_type: str
    title: str
    status: DocumentStatusName
    chunk_count: int
    embedded_count: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, document: Document) -> "DocumentSummaryOut":
        return cls(
            id=document.id,
            collection=document.collection.name,
            source_uri=document.source_uri,
            content_type=document.content_type,
            title=document.title,
            status=document.status,
            chunk_count=document.chunk_count,
            embedded_count=document.embedded_count,
            created_at=document.created_at,
            updated_at=document.updated_at,
        )


class DocumentListOut(Schema):
    collection: str
    documents: list[DocumentSummaryOut]
    count: int = Field(description="Documents in this page")
    offset: int
    limit: int


class DocumentGetQuery(InputSchema):
    chunks: bool = Field(False, description="Include the chunks")
    content: bool = Field(False, description="Include the extracted text")


class ChunkOut(Schema):
    index: int
    content: str
    tokens: int
    lines: str
    line_start: int
    line_end: int
    page: int | None
    heading_path: list[str] = Field(description="Titles of the sections the chunk starts in, outermost first")
    metadata: dict[str, Any]

    @classmethod
    def of(cls, chunk: Chunk) -> "ChunkOut":
        return cls(
            index=chunk.index,
            content=chunk.content,
            tokens=chunk.token_count,
            lines=chunk.lines,
            line_start=chunk.line_start,
            line_end=chunk.line_end,
            page=chunk.page,
            heading_path=chunk.heading_path,
            metadata=chunk.metadata or {},
        )


class DocumentOut(DocumentSummaryOut):
    error_code: str
    error: str
    size_bytes: int
    metadata: dict[str, Any]
    content: str | None = Field(description="The extracted text, when asked for")
    chunks: list[ChunkOut] | None = Field(description="The chunks, when asked for")

    @classmethod
    def of_document(cls, document: Document, *, chunks: Iterable[Chunk] | None, content: str | None) -> "DocumentOut":
        return cls(
            **DocumentSummaryOut.of(document).model_dump(),
            error_code=document.error_code,
            error=document.error,
            size_bytes=document.size_bytes,
            metadata=document.metadata or {},
            content=content,
            chunks=None if chunks is None else [ChunkOut.of(chunk) for chunk in chunks],
        )


class NeighborsQuery(InputSchema):
    before: int = Field(1, ge=0, le=MAX_NEIGHBORS, description="Chunks before this one")
    after: int = Field(1, ge=0, le=MAX_NEIGHBORS, description="Chunks after this one")


class NeighborsOut(Schema):
    document_id: str
    source_uri: str
    title: str
    collection: str
    chunks: list[ChunkOut] = Field(description="The chunk asked for and its neighbours, in order")

    @classmethod
    def of(cls, document: Document, chunks: Iterable[Chunk]) -> "NeighborsOut":
        return cls(
            document_id=document.id,
            source_uri=document.source_uri,
            title=document.title,
            collection=document.collection.name,
            chunks=[ChunkOut.of(chunk) for chunk in chunks],
        )


WAIT_DESCRIPTION = (
    "Answer once the documents are searchable by meaning (at most KB_WRITE_WAIT_SECONDS; "
    "`searchable` says whether they are)"
)


class IngestIn(BodyInputSchema):
    # The URI, content type and title are the ingestion service's to judge, for every door alike.
    uri: str = Field(
        description="file:// (under KB_FILE_ROOTS), http(s):// or data: URI; a directory ingests every file in it",
        examples=["data:,Hello from the knowledge base"],
    )
    content_type: str | None = Field(None, description=CONTENT_TYPE_DESCRIPTION)
    metadata: dict[str, Any] | None = None
    title: str | None = Field(None, description="At most 500 characters; replaces the detected title")
    recursive: bool = Field(True, description="For directories: include subdirectories")
    force: bool = Field(False, description="Re-chunk even when the content did not change")
    wait: bool = Field(False, description=WAIT_DESCRIPTION)


class WaitQuery(InputSchema):
    """`?wait=true` on a write's address means what the body's or form's `wait` means."""

    wait: bool = Field(False, description=WAIT_DESCRIPTION)


class UploadForm(InputSchema):
    content_type: str | None = Field(None, description=CONTENT_TYPE_DESCRIPTION)
    metadata: Json[dict[str, Any]] | None = Field(None, description="A JSON object attached to every file")
    wait: bool = Field(False, description=WAIT_DESCRIPTION)


class IngestItemOut(Schema):
    source_uri: str
    outcome: ItemOutcome
    doc_id: str | None
    status: DocumentStatusName | None
    chunks: int
    chunks_reused: int
    error: ErrorDetail | None

    @classmethod
    def of(cls, item: IngestItem) -> "IngestItemOut":
        document = item.document
        return cls(
            source_uri=item.source_uri,
            outcome=item.outcome,
            doc_id=document.id if document else None,
            status=document.status if document else None,
            chunks=document.chunk_count if document else 0,
            chunks_reused=item.chunks_reused,
            error=ErrorDetail(code=item.error.code, message=item.error.message) if item.error else None,
        )

    @classmethod
    def of_stored(cls, stored: StoredDocument) -> "IngestItemOut":
        return cls.of(
            IngestItem(
                source_uri=stored.document.source_uri,
                outcome=stored.outcome,
                document=stored.document,
                chunks_reused=stored.chunks_reused,
            )
        )


class IngestOut(Schema):
    collection: str
    created: int
    updated: int
    unchanged: int
    skipped: int = Field(description="Files of a folder whose type is not supported")
    failed: int
    items: list[IngestItemOut]
    # With wait=true: whether every document was searchable by meaning when the answer left.
    searchable: bool | None = None

    @classmethod
    def of(cls, collection: str, items: Sequence[IngestItem], searchable: bool | None = None) -> "IngestOut":
        count = IngestReport(items=list(items)).count
        return cls(
            collection=collection,
            created=count("created"),
            updated=count("updated"),
            unchanged=count("unchanged"),
            skipped=count("skipped"),
            failed=count("failed"),
            items=[IngestItemOut.of(item) for item in items],
            searchable=searchable,
        )


class DocumentDeletedOut(Schema):
    success: bool
    deleted_doc_id: str
    source_uri: str
    collection: str


# --- search, stats, health --------------------------------------------------------------------


class SearchIn(BodyInputSchema):
    """The search service checks every bound (the same messages as MCP's and the commands')."""

    query: str = Field(
        examples=["How do I deploy the service?"], description="At most KB_MAX_QUERY_CHARS (10,000) characters"
    )
    collections: list[str] | None = Field(
        None, description=f"Default: every collection you can see (at most {MAX_FILTER_VALUES})"
    )
    top_k: int | None = Field(
        None, description=f"1 to {MAX_TOP_K}; default: the collection's search_top_k, else {DEFAULT_TOP_K}"
    )
    mode: Mode | None = Field(None, description="Default: the collection's (search_hybrid false: keyword), else hybrid")
    semantic_weight: float | None = Field(
        None, description="Hybrid fusion weight, 0.0 to 1.0 (1.0 semantic only); default: the collection's"
    )
    min_score: float | None = Field(None, description="Drop results whose score (0.0 to 1.0) is lower")
    min_similarity: float | None = Field(None, description="Drop results less similar (cosine, -1.0 to 1.0)")
    document_ids: list[str] | None = Field(None, description=f"Only these documents (at most {MAX_FILTER_DOCUMENTS})")
    content_types: list[str] | None = Field(
        None, description=f"Only documents of these content types: {', '.join(CONTENT_TYPES)}"
    )
    metadata: dict[str, Any] | None = Field(
        None,
        description="Filter on document metadata, e.g. "
        '{"author": "Smith", "year": {"$gte": 2020}, "lang": {"$in": ["en"]}}',
    )
    candidate_depth: int | None = Field(
        None, description=f"Candidates per retriever before fusion, 1 to {MAX_CANDIDATE_DEPTH}"
    )
    group_by_document: bool = Field(
        False, description="One result per document (its best chunk); document_hits counts its candidates"
    )


class StatsQuery(InputSchema):
    collection: str | None = Field(None, description="Default: all")


class HealthOut(Schema):
    status: HealthStatus
    checks: dict[str, dict[str, Any]]


# --- sources ----------------------------------------------------------------------------------

SourceName = Annotated[str, Path(description="Source name", example="handbook")]
SyncRunId = Annotated[str, Path(description="Sync run ID (ULID)")]


class SourceCreateIn(BodyInputSchema):
    name: str = Field(description="Letters, digits, '-' and '_'", examples=["handbook"])
    collection: str = Field(description="The collection the source keeps in sync")
    folder: str = Field("", description="A folder under KB_FILE_ROOTS (file:// URI or path); or give urls")
    recursive: bool = Field(True, description="Folders: include subfolders")
    include: list[str] = Field([], description="Folders: globs a file must match, e.g. ['*.md', 'docs/*']")
    exclude: list[str] = Field([], description="Folders: globs of files to leave out")
    urls: list[str] = Field([], description="http(s) URLs to follow")
    sitemap_url: str = Field("", description="A sitemap whose page URLs are followed too")
    interval_minutes: int | None = Field(None, description="Sync on this schedule; omit for on demand only")


class SourceUpdateIn(BodyInputSchema):
    """Only the fields given change; the next sync follows the new scope and removes the documents
    the source brought and no longer covers. ``interval_minutes: null`` syncs on demand only."""

    # The defaults are never applied: a field left out keeps the source's value.
    collection: str = Field("", description="Move it to another collection")
    folder: str = ""
    recursive: bool = True
    include: list[str] = []
    exclude: list[str] = []
    urls: list[str] = []
    sitemap_url: str = ""
    interval_minutes: int | None = None


class SourceListOut(Schema):
    sources: list[SourceOut]
    total: int


class SyncStartOut(Schema):
    started: bool = Field(description="False: a sync of this source was already queued or running; run is that one")
    run: SyncRunOut


class SyncRunListOut(Schema):
    source: str
    runs: list[SyncRunOut]
