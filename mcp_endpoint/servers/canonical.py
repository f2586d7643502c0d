"""The canonical MCP server: rag-mcp's seven tools (seed 001) with their arguments, defaults, result
shapes and error codes, plus what a curator needs over MCP: delete a collection, fetch a document,
read the chunks around a search hit, follow ingestion. Every tool is a thin adapter over kb.services /
kb.selectors / kb.search."""

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio
from pydantic import Field, Strict, WithJsonSchema
from typing_extensions import TypedDict

from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import CONTENT_TYPES
from kb.models import COLLECTION_NAME_PATTERN, MAX_TOP_K, DocumentStatusName, TokenScope
from kb.search import Mode, search
from kb.selectors.collections import collection_list
from kb.selectors.documents import (
    DEFAULT_PAGE_SIZE,
    MAX_NEIGHBORS,
    MAX_PAGE_SIZE,
    chunk_neighbors,
    document_list,
    document_with_chunks,
)
from kb.selectors.ingestion import STILL_EMBEDDING, ingestion_status, status_doc_ids
from kb.selectors.sources import SourceOut, SyncRunOut, source_list, sync_run_latest
from kb.selectors.stats import Stats, kb_stats
from kb.services.collections import collection_create, collection_delete
from kb.services.documents import document_delete
from kb.services.embedding_pipeline import documents_embed_for_writer
from kb.services.ingest import document_ingest
from kb.services.sources import source_changes, source_create, source_update, sync_start
from mcp_endpoint.budget import fit_list, fit_texts
from mcp_endpoint.caller import current_access, current_caller
from mcp_endpoint.servers import prompts, resources
from mcp_endpoint.servers.rag_shapes import (
    ChunkOutput,
    CollectionSummary,
    DocumentDetail,
    DocumentProgress,
    DocumentSummary,
    IngestOutput,
    SearchOutput,
    chunk_output,
    collection_summary,
    document_detail,
    document_progress,
    document_summary,
    ingest_output,
    search_output,
)
from mcp_endpoint.tooling import (
    ADDITIVE,
    CREATING,
    DESTRUCTIVE,
    FETCHING,
    READ_ONLY,
    SYNCING,
    KBServer,
    in_thread,
    service_tool,
)

INSTRUCTIONS = (
    "A knowledge base of document collections. Search with rag_search (hybrid keyword + semantic) and cite "
    "each result's source_uri and lines. Add documents with rag_ingest (file://, https:// or data: URIs); "
    "they are keyword-searchable at once and semantically searchable once embedded (rag_ingestion_status)."
)
POLL_SECONDS = 0.5
T = TypeVar("T")
COLLECTIONS_IN_DESCRIPTION = 50

CollectionName = Annotated[str, Field(description="Collection name (letters, digits, '-' and '_'; case-sensitive)")]
DocId = Annotated[str, Field(description="Document ID (ULID), as returned by rag_ingest or rag_search's 'source'")]


@service_tool(TokenScope.READ)
def rag_search(
    query: Annotated[str, Field(description="The search query: natural language works best")],
    collection: Annotated[
        str | None, Field(description="Search only this collection; omit to search all collections")
    ] = None,
    # Advertised as the seed has them (10, true); left out, the collection's own settings apply,
    # which are 10 and true unless a curator changed them.
    top_k: Annotated[
        int | None,
        Field(ge=1, le=MAX_TOP_K, description="Number of results to return", json_schema_extra={"default": 10}),
        WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_TOP_K}),
    ] = None,
    hybrid: Annotated[
        bool | None,
        Field(
            description="Use hybrid search combining vector and keyword; false gives keyword-only (exact terms)",
            json_schema_extra={"default": True},
        ),
        WithJsonSchema({"type": "boolean"}),
    ] = None,
    mode: Annotated[Mode | None, Field(description="Search mode; overrides 'hybrid' when set")] = None,
    semantic_weight: Annotated[
        float | None,
        Field(ge=0.0, le=1.0, description="Hybrid mode: weight of semantic vs keyword ranks (default per collection)"),
    ] = None,
    min_score: Annotated[float | None, Field(description="Drop results whose score (0 to 1) is below this")] = None,
    metadata_filter: Annotated[
        dict[str, Any] | None,
        Field(
            description="Only documents whose metadata match, e.g. "
            '{"author": "Smith", "year": {"$gte": 2020}, "lang": {"$in": ["en", "de"]}} '
            "(operators: $eq $ne $gt $gte $lt $lte $in)"
        ),
    ] = None,
    content_types: Annotated[
        list[str] | None, Field(description="Only these content types, e.g. ['python', 'markdown']")
    ] = None,
    document_ids: Annotated[list[str] | None, Field(description="Only these documents")] = None,
    group_by_document: Annotated[
        bool,
        Field(description="One result per document (its best chunk); document_hits counts the document's matches"),
    ] = False,
) -> SearchOutput:
    """Search the knowledge base with hybrid search: BM25 keyword ranking and semantic similarity, combined
    into one 0-1 score. Each result has the chunk text, its document ('source' is the document ID,
    'source_uri' where it came from), collection, line range (metadata.lines), page and section headings
    (metadata.heading_path) to cite; rag_read_neighbors gives the text around it."""
    access = current_access()
    response = search(
        query=query,
        collections=access.search_collections([collection] if collection is not None else None),
        top_k=top_k,
        mode=mode or (None if hybrid is None else "hybrid" if hybrid else "keyword"),
        semantic_weight=semantic_weight,
        min_score=min_score,
        metadata=metadata_filter,
        content_types=content_types,
        document_ids=document_ids,
        group_by_document=group_by_document,
    )
    output = search_output(response)
    output["truncated"] = fit_list(output["results"], "content", envelope=output, flag_key="content_truncated")
    output["total_results"] = len(output["results"])
    return output


@service_tool(TokenScope.WRITE)
def rag_ingest(
    uri: Annotated[
        str,
        Field(description="URI of the document: file:// (a file or a folder), https://, or data: for raw content"),
    ],
    collection: CollectionName,
    content_type: Annotated[
        str | None,
        Field(
            description="Content type override; detected when omitted",
            json_schema_extra={"enum": [*CONTENT_TYPES, None]},
        ),
    ] = None,
    metadata: Annotated[dict[str, Any] | None, Field(description="Metadata to attach to the document")] = None,
    title: Annotated[str | None, Field(description="Title to use instead of the detected one")] = None,
    force: Annotated[bool, Field(description="Re-index even when the content did not change")] = False,
) -> IngestOutput:
    """Ingest a document into a collection (create the collection first with rag_create_collection).
    Content is deduplicated by hash: an unchanged source is a no-op, a changed one is updated in place.
    A single source answers once it is searchable (status 'ready'), or after a bounded wait with a
    'note' that embedding continues (follow it with rag_ingestion_status); a folder answers at once."""
    caller = current_caller()
    report = document_ingest(
        collection=caller.access.collection(collection),
        uri=uri,
        file_roots=caller.file_roots(),
        content_type=content_type,
        metadata=metadata,
        title=title,
        force=force,
    )
    # One source is an agent's write: answer once it can be found by meaning (a folder is bulk work).
    searchable = len(report.items) > 1 or documents_embed_for_writer(documents=report.documents)
    return ingest_output(collection=collection, uri=uri, report=report, note=None if searchable else STILL_EMBEDDING)


class DeleteOutput(TypedDict):
    success: bool
    deleted_doc_id: str
    source_uri: str
    collection: str


@service_tool(TokenScope.WRITE)
def rag_delete(doc_id: DocId) -> DeleteOutput:
    """Delete a document with its chunks and embeddings."""
    current_access().document(doc_id)
    document = document_delete(doc_id=doc_id)
    return DeleteOutput(
        success=True, deleted_doc_id=document.pk, source_uri=document.source_uri, collection=document.collection.name
    )


class CollectionsOutput(TypedDict):
    collections: list[CollectionSummary]
    total: int
    truncated: bool


@service_tool(TokenScope.READ)
def rag_list_collections() -> CollectionsOutput:
    """List the collections with their document and chunk counts (created_at in Unix milliseconds).
    Past the response budget, descriptions are cut and the last collections left out: ``truncated``
    says so and ``total`` still counts them all."""
    access = current_access()
    collections = [collection_summary(c) for c in collection_list() if access.can_see(c.name)]
    output = CollectionsOutput(collections=collections, total=len(collections), truncated=False)
    output["truncated"] = fit_list(collections, "description", envelope=output)
    return output


class DocumentsOutput(TypedDict):
    collection: str
    documents: list[DocumentSummary]
    count: int
    offset: int
    limit: int
    truncated: bool


@service_tool(TokenScope.READ)
def rag_list_documents(
    collection: CollectionName,
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE_SIZE, description="Maximum documents to return")] = DEFAULT_PAGE_SIZE,
    offset: Annotated[int, Field(ge=0, description="Pagination offset")] = 0,
    status: Annotated[DocumentStatusName | None, Field(description="Only documents in this state")] = None,
) -> DocumentsOutput:
    """List the documents of a collection, oldest first. Past the response budget the page ends
    early (``truncated``; ``count`` is what it holds): ask again from ``offset + count``."""
    collection_row = current_access().collection(collection)
    documents = document_list(collection=collection_row, limit=limit, offset=offset, status=status)
    summaries = [document_summary(document) for document in documents]
    output = DocumentsOutput(
        collection=collection, documents=summaries, count=len(summaries), offset=offset, limit=limit, truncated=False
    )
    output["truncated"] = fit_list(summaries, "source_uri", envelope=output)
    output["count"] = len(summaries)
    return output


class CreatedCollection(TypedDict):
    success: bool
    name: str
    description: str
    uuid: str


@service_tool(TokenScope.WRITE, every_collection_to="create collections")
def rag_create_collection(
    name: Annotated[
        str,
        Field(description="Collection name (alphanumeric, hyphens, underscores)", pattern=COLLECTION_NAME_PATTERN),
    ],
    description: Annotated[str, Field(description="Optional description")] = "",
) -> CreatedCollection:
    """Create a new, empty collection."""
    collection = collection_create(name=name, description=description)
    return CreatedCollection(
        success=True, name=collection.name, description=collection.description, uuid=str(collection.uuid)
    )


class StatsOutput(Stats):
    """rag-mcp's shape: ``filter`` is a string, left out when no collection is filtered."""

    filter: str | None = Field(
        None, exclude_if=lambda value: value is None, description="Collection filter applied (if any)"
    )


@service_tool(TokenScope.READ)
def rag_stats(
    collection: Annotated[str | None, Field(description="Optional collection to filter stats")] = None,
) -> StatsOutput:
    """Statistics of the knowledge base, or of one collection: documents, chunks, embeddings, storage size,
    and documents still waiting for embedding."""
    access = current_access()
    if collection is None:
        access.require_unrestricted("see statistics of the whole knowledge base")
    else:
        access.check_collection(collection)
    return StatsOutput.model_validate(kb_stats(collection=collection).model_dump())


class CollectionDeleted(TypedDict):
    success: bool
    name: str
    documents_deleted: int
    chunks_deleted: int


@service_tool(TokenScope.ADMIN)
def rag_delete_collection(
    name: CollectionName,
    confirm: Annotated[
        bool, Strict(), Field(description="Must be true: the collection and all its documents are deleted")
    ] = False,
) -> CollectionDeleted:
    """Delete a collection with all its documents, chunks and embeddings. Requires confirm: true."""
    current_access().check_collection(name)
    deletion = collection_delete(name=name, confirm=confirm)
    return CollectionDeleted(
        success=True, name=deletion.name, documents_deleted=deletion.documents, chunks_deleted=deletion.chunks
    )


class DocumentOutput(DocumentDetail):
    raw_content: str | None
    chunks: list[ChunkOutput] | None
    truncated: bool


@service_tool(TokenScope.READ)
def rag_get_document(
    doc_id: DocId,
    include_content: Annotated[bool, Field(description="Include the document's full text")] = False,
    include_chunks: Annotated[bool, Field(description="Include its chunks")] = False,
) -> DocumentOutput:
    """A document's metadata, ingestion status and chunk count; its text and chunks on request (long
    texts are cut to the response budget, visibly)."""
    document, stored = document_with_chunks(access=current_access(), doc_id=doc_id, chunks=include_chunks)
    chunks = None if stored is None else [chunk_output(chunk) for chunk in stored]
    output = DocumentOutput(
        **document_detail(document),
        raw_content=document.raw_content if include_content else None,
        chunks=chunks,
        truncated=False,
    )
    texts = [(output, "raw_content")] if include_content else []
    output["truncated"] = bool(fit_texts(output, texts + [(chunk, "content") for chunk in chunks or []]))
    return output


class NeighborsOutput(TypedDict):
    source: str
    source_uri: str
    title: str
    collection: str
    chunks: list[ChunkOutput]
    truncated: bool


@service_tool(TokenScope.READ)
def rag_read_neighbors(
    doc_id: DocId,
    chunk_index: Annotated[int, Field(description="A search result's metadata.chunk_index")],
    before: Annotated[int, Field(ge=0, le=MAX_NEIGHBORS, description="Chunks before it")] = 1,
    after: Annotated[int, Field(ge=0, le=MAX_NEIGHBORS, description="Chunks after it")] = 1,
) -> NeighborsOutput:
    """The text around a search result: the chunk and up to 'before'/'after' chunks on each side of it,
    in document order (long texts are cut to the response budget, visibly)."""
    document = current_access().document(doc_id)
    chunks = [
        chunk_output(chunk)
        for chunk in chunk_neighbors(document=document, chunk_index=chunk_index, before=before, after=after)
    ]
    output = NeighborsOutput(
        source=document.id,
        source_uri=document.source_uri,
        title=document.title,
        collection=document.collection.name,
        chunks=chunks,
        truncated=False,
    )
    output["truncated"] = bool(fit_texts(output, [(chunk, "content") for chunk in chunks]))
    return output


class IngestionStatusOutput(TypedDict):
    done: bool
    counts: dict[str, int]
    documents: list[DocumentProgress]


@service_tool(TokenScope.READ)
def _ingestion_progress(doc_ids: list[str] | None, collection: str | None) -> IngestionStatusOutput:
    access = current_access()
    if collection is not None:
        status = ingestion_status(collection=access.collection(collection))
    else:
        if doc_ids is not None:
            doc_ids = status_doc_ids(doc_ids)
            for doc_id in doc_ids:
                access.document(doc_id)
        status = ingestion_status(doc_ids=doc_ids)
    documents = [document_progress(document) for document in status.documents]
    return IngestionStatusOutput(done=status.done, counts=status.counts, documents=documents)


async def rag_ingestion_status(
    doc_ids: Annotated[list[str] | None, Field(description="Documents to follow (IDs from rag_ingest)")] = None,
    collection: Annotated[str | None, Field(description="Or: a whole collection")] = None,
    wait_seconds: Annotated[
        float, Field(ge=0, le=120, description="Wait up to this long for embedding to finish before answering")
    ] = 0,
) -> IngestionStatusOutput:
    """Ingestion status of documents (or of a collection): pending, processing, ready or failed with
    the error. 'done' is true when nothing is waiting for embedding; give wait_seconds to wait for it."""
    return await _polled(
        lambda: _ingestion_progress(doc_ids, collection),
        lambda progress: not isinstance(progress, dict) or progress["done"],
        wait_seconds,
    )


async def _polled(fetch: Callable[[], Awaitable[T]], finished: Callable[[T], bool], wait_seconds: float) -> T:
    """``fetch()`` again every POLL_SECONDS until ``finished`` (an error result finishes too) or
    ``wait_seconds`` have passed."""
    deadline = time.monotonic() + wait_seconds
    result = await fetch()
    while not finished(result) and time.monotonic() < deadline:
        await anyio.sleep(POLL_SECONDS)
        result = await fetch()
    return result


SourceName = Annotated[str, Field(description="Source name, as given to rag_create_source")]


@service_tool(TokenScope.WRITE)
def rag_create_source(
    name: Annotated[str, Field(description="Source name (letters, digits, '-' and '_')")],
    collection: CollectionName,
    folder: Annotated[str, Field(description="A folder under the server's KB_FILE_ROOTS; or give urls")] = "",
    urls: Annotated[list[str] | None, Field(description="http(s) URLs to follow")] = None,
    sitemap_url: Annotated[str, Field(description="A sitemap whose page URLs are followed too")] = "",
    include: Annotated[list[str] | None, Field(description="Folders: globs a file must match, e.g. ['*.md']")] = None,
    exclude: Annotated[list[str] | None, Field(description="Folders: globs of files to leave out")] = None,
    recursive: Annotated[bool, Field(description="Folders: include subfolders")] = True,
    interval_minutes: Annotated[
        int | None, Field(ge=1, description="Sync on this schedule; omit to sync only when asked (rag_sync_start)")
    ] = None,
) -> SourceOut:
    """Make a collection follow a folder or a list of URLs: each sync (rag_sync_start) ingests new and
    changed files, leaves unchanged ones alone and removes documents whose file is gone."""
    source = source_create(
        collection=current_access().collection(collection),
        name=name,
        folder=folder,
        urls=urls or [],
        sitemap_url=sitemap_url,
        include=include or [],
        exclude=exclude or [],
        recursive=recursive,
        interval_minutes=interval_minutes,
    )
    return SourceOut.of(source)


@service_tool(TokenScope.WRITE)
def rag_update_source(
    name: SourceName,
    collection: Annotated[str | None, Field(description="Move it to another collection")] = None,
    folder: Annotated[str | None, Field(description="A folder under the server's KB_FILE_ROOTS")] = None,
    urls: Annotated[list[str] | None, Field(description="http(s) URLs to follow (replaces the list)")] = None,
    sitemap_url: Annotated[str | None, Field(description="A sitemap whose page URLs are followed too")] = None,
    include: Annotated[list[str] | None, Field(description="Folders: globs a file must match (replaces)")] = None,
    exclude: Annotated[list[str] | None, Field(description="Folders: globs of files to leave out (replaces)")] = None,
    recursive: Annotated[bool | None, Field(description="Folders: include subfolders")] = None,
    interval_minutes: Annotated[int | None, Field(ge=1, description="Sync on this schedule")] = None,
    on_demand: Annotated[bool, Field(description="Stop the schedule: sync only when asked")] = False,
) -> SourceOut:
    """Change a source; what is left out stays as it is. The next sync follows the new scope and removes
    the documents the source brought and no longer covers. Change a source rather than delete and create
    it again: a new source never removes documents that were in the collection before it."""
    access = current_access()
    source = access.source(name)
    changes = source_changes(
        on_demand=on_demand,
        collection=None if collection is None else access.collection(collection),
        folder=folder,
        urls=urls,
        sitemap_url=sitemap_url,
        include=include,
        exclude=exclude,
        recursive=recursive,
        interval_minutes=interval_minutes,
    )
    return SourceOut.of(source_update(source=source, **changes))


class SourcesOutput(TypedDict):
    sources: list[SourceOut]
    total: int


@service_tool(TokenScope.READ)
def rag_list_sources() -> SourcesOutput:
    """The sources collections follow, with their schedule and last sync run."""
    access = current_access()
    sources = [SourceOut.of(source) for source in source_list() if access.can_see(source.collection.name)]
    return SourcesOutput(sources=sources, total=len(sources))


class SyncStartOutput(TypedDict):
    job_id: str
    started: bool
    run: SyncRunOut


@service_tool(TokenScope.WRITE)
def rag_sync_start(source: SourceName) -> SyncStartOutput:
    """Start syncing a source in the background and answer at once with its job_id (follow it with
    rag_sync_status). If a sync of the source is already running, its job is returned (started: false)."""
    start = sync_start(source=current_access().source(source))
    return SyncStartOutput(job_id=start.run.pk, started=start.started, run=SyncRunOut.of(start.run))


@service_tool(TokenScope.READ)
def _sync_progress(job_id: str | None, source: str | None) -> SyncRunOut:
    access = current_access()
    if job_id is not None:
        return SyncRunOut.of(access.sync_run(job_id))
    if source is None:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "Give a job_id or a source")
    return SyncRunOut.of(sync_run_latest(source=access.source(source)))


async def rag_sync_status(
    job_id: Annotated[str | None, Field(description="The job_id rag_sync_start returned")] = None,
    source: Annotated[str | None, Field(description="Or: a source, for its latest run")] = None,
    wait_seconds: Annotated[
        float, Field(ge=0, le=120, description="Wait up to this long for the run to finish before answering")
    ] = 0,
) -> SyncRunOut:
    """A sync run's status (queued, running, succeeded, failed) and counts: files found and processed,
    added, updated, unchanged, removed, failed with reasons. Give wait_seconds to wait for it to finish."""
    return await _polled(
        lambda: _sync_progress(job_id, source),
        lambda progress: not isinstance(progress, SyncRunOut) or progress.done,
        wait_seconds,
    )


def _collections_for_description() -> str:
    access = current_access()
    names = [f"{c.name} ({c.document_total} documents)" for c in collection_list() if access.can_see(c.name)]
    if not names:
        return "There are no collections yet."
    shown = ", ".join(names[:COLLECTIONS_IN_DESCRIPTION])
    more = f" and {len(names) - COLLECTIONS_IN_DESCRIPTION} more" if len(names) > COLLECTIONS_IN_DESCRIPTION else ""
    return f"Existing collections: {shown}{more}."


async def collections_for_description() -> str:
    try:
        return await in_thread(_collections_for_description)
    except KBError:
        return ""


TOOLS = [
    (rag_search, READ_ONLY),
    (rag_ingest, FETCHING),
    (rag_delete, DESTRUCTIVE),
    (rag_list_collections, READ_ONLY),
    (rag_list_documents, READ_ONLY),
    (rag_create_collection, CREATING),
    (rag_stats, READ_ONLY),
    (rag_delete_collection, DESTRUCTIVE),
    (rag_get_document, READ_ONLY),
    (rag_read_neighbors, READ_ONLY),
    (rag_ingestion_status, READ_ONLY),
    (rag_create_source, CREATING),
    (rag_update_source, ADDITIVE),
    (rag_list_sources, READ_ONLY),
    (rag_sync_start, SYNCING),
    (rag_sync_status, READ_ONLY),
]


def build(*, read_only: bool) -> KBServer:
    server = KBServer(
        "rag-mcp",
        version="0.1.0",
        description="Local RAG system with hybrid search",
        instructions=INSTRUCTIONS,
        errors="json",
        strict_arguments=True,
    )
    server.add_tools(TOOLS, read_only=read_only)
    server.describe_live("rag_search", collections_for_description)
    resources.register(server)
    prompts.register(server, citations=True)
    return server
