"""The SciRAG profile (seed 000): retrieve_document_chunks, store_document_chunks, list_collections,
with SciRAG's argument names, defaults, result shapes and error behaviour:

- retrieve_document_chunks raises on errors (the client gets an error result with the message);
  its scores are cosine similarities clipped to [0, 1] (semantic search, as SciRAG's is).
- store_document_chunks never raises: ``success: false`` with a message such as
  ``Validation error: Chunk 3 missing required field 'text'`` (chunks are numbered from 0).
- list_collections returns the names, or ``[]`` on any error.

Each ``source_filename`` becomes one document (its source URI), its chunks stored as given.
"""

import logging
import time
from typing import Annotated, Any

from django.db import DatabaseError
from pydantic import Field
from typing_extensions import TypedDict

from kb.errors import ErrorCode, KBError
from kb.models import MAX_TOP_K, TokenScope
from kb.search import SearchResult, search
from kb.selectors.collections import collection_list
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.embedding_pipeline import documents_embed_for_writer
from kb.services.ingest import UPLOAD_PREFIX, ChunkInput, document_store_chunk_batch
from mcp_endpoint.budget import fit_list
from mcp_endpoint.caller import current_access
from mcp_endpoint.servers.rag_shapes import file_name
from mcp_endpoint.tooling import ADDITIVE, READ_ONLY, KBServer, raise_tool_error, service_tool

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "DocumentChunks"
REQUIRED_CHUNK_FIELDS = ("text", "source_filename", "chunk_index")
SCIRAG_METADATA = ("file_size", "page_count", "creation_date", "modification_date", "ingestion_date", "title", "author")


class RetrievedChunk(TypedDict):
    text: str
    source_filename: str
    chunk_index: int
    score: float
    metadata: dict[str, Any]


def retrieved_chunk(result: SearchResult) -> RetrievedChunk:
    # SciRAG's fields first (None when unknown), then what the chunk was stored with, as each of the
    # seed's chunks keeps its own (with the time it was stored: _store); never its document's, the
    # union of its chunks' (one chunk's page_count and title had shown on all of them). A chunk of
    # a file another door parsed has none of its own: it shows its document's.
    own = result.chunk_metadata
    metadata = dict.fromkeys(SCIRAG_METADATA) | (
        {"ingestion_date": result.metadata.get("ingestion_date")} | own
        if own
        else result.metadata | {"title": result.metadata.get("title") or result.title or None}
    )
    return RetrievedChunk(
        text=result.content,
        source_filename=source_filename(result.source_uri),
        chunk_index=result.chunk_index,
        score=min(1.0, max(0.0, result.similarity or 0.0)),
        metadata=metadata,
    )


def source_filename(source_uri: str) -> str:
    """What a SciRAG client stored (its own name, a path, a URL) comes back as it was: only the
    base name had, and reports/2024/q1.pdf and reports/2023/q1.pdf were both q1.pdf. A file that
    another door ingested or uploaded shows its file name."""
    return file_name(source_uri) if source_uri.startswith(("file://", UPLOAD_PREFIX)) else source_uri


@service_tool(TokenScope.READ, on_error=raise_tool_error)
def retrieve_document_chunks(
    query: Annotated[str, Field(description="The search query text")],
    top_k: Annotated[int, Field(description="Number of top results to return")] = 5,
    collection: Annotated[
        str | None, Field(description="Collection name to filter by. If null, searches all collections")
    ] = None,
) -> list[RetrievedChunk]:
    """Searches the document knowledge base for text chunks semantically similar to a query."""
    access = current_access()
    response = search(
        query=query,
        collections=access.search_collections([collection] if collection is not None else None),
        top_k=min(top_k, MAX_TOP_K),  # the seed sets no maximum: at most the server's
        mode="semantic",
    )
    chunks = [retrieved_chunk(result) for result in response.results]
    fit_list(chunks, "text")
    return chunks


class StoreResult(TypedDict):
    success: bool
    chunks_stored: int
    collection: str
    message: str


def chunk_problem(position: int, chunk: dict[str, Any]) -> str | None:
    for name in REQUIRED_CHUNK_FIELDS:
        if chunk.get(name) is None:
            return f"Chunk {position} missing required field '{name}'"
    if not isinstance(chunk["text"], str) or not isinstance(chunk["source_filename"], str):
        return f"Chunk {position}: 'text' and 'source_filename' must be strings"
    if isinstance(chunk["chunk_index"], bool) or not isinstance(chunk["chunk_index"], int):
        return f"Chunk {position}: 'chunk_index' must be an integer"
    if not isinstance(chunk.get("metadata") or {}, dict):
        return f"Chunk {position}: 'metadata' must be an object"
    return None


def stored_metadata(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk's own metadata and, as SciRAG sets it, when it was stored (a later store of other
    chunks of its file leaves it be)."""
    return (chunk.get("metadata") or {}) | {"ingestion_date": time.time()}


def _store(chunks: list[dict[str, Any]], collection: str) -> StoreResult:
    access = current_access()
    access.check_collection(collection)
    problems = [problem for position, chunk in enumerate(chunks) if (problem := chunk_problem(position, chunk))]
    if problems or not chunks:
        raise KBError(ErrorCode.INVALID_ARGUMENT, problems[0] if problems else "No chunks to store")
    stored = document_store_chunk_batch(
        collection_name=collection,
        chunks=[ChunkInput(c["chunk_index"], c["text"], stored_metadata(c)) for c in chunks],
        sources=[c["source_filename"] for c in chunks],
        create_collection=access.unrestricted,
    )
    # SciRAG promises the embeddings exist when it answers: a retrieve right after finds the chunks.
    searchable = documents_embed_for_writer(documents=[item.document for item in stored])
    return StoreResult(
        success=True,
        chunks_stored=len(chunks),
        collection=collection,
        message=f"Successfully stored {len(chunks)} chunks" + ("" if searchable else f". {STILL_EMBEDDING}"),
    )


def _store_refused(error: KBError, arguments: dict[str, Any]) -> StoreResult:
    collection = arguments.get("collection", DEFAULT_COLLECTION)
    return StoreResult(success=False, chunks_stored=0, collection=collection, message=f"Error: {error.message}")


# SciRAG's store never raises, not even for a token without write access.
@service_tool(TokenScope.WRITE, on_error=_store_refused)
def store_document_chunks(
    chunks: Annotated[
        list[dict[str, Any]],
        Field(
            description="List of chunk dictionaries: text (required), source_filename (required), "
            "chunk_index (required, integer), metadata (optional: file_size, page_count, creation_date, "
            "modification_date, title, author)"
        ),
    ],
    collection: Annotated[str, Field(description="Collection name to store chunks in")] = DEFAULT_COLLECTION,
) -> StoreResult:
    """Stores document chunks in the vectorstore. Automatically generates embeddings for each chunk's text."""
    try:
        return _store(chunks, collection)
    except KBError as error:
        prefix = "Validation error" if error.code == ErrorCode.INVALID_ARGUMENT else "Error"
        message = f"{prefix}: {error.message}"
    except DatabaseError:
        logger.exception("store_document_chunks failed")
        message = "Error: the database failed; see the server log"
    return StoreResult(success=False, chunks_stored=0, collection=collection, message=message)


@service_tool(TokenScope.READ, on_error=lambda error, arguments: [])
def list_collections() -> list[str]:
    """Lists all available document collections in the vectorstore."""
    access = current_access()
    return [collection.name for collection in collection_list() if access.can_see(collection.name)]


def build(*, read_only: bool) -> KBServer:
    server = KBServer("SciRAG", instructions="Document retrieval and storage using vector search.")
    server.add_tools(
        [(retrieve_document_chunks, READ_ONLY), (store_document_chunks, ADDITIVE), (list_collections, READ_ONLY)],
        read_only=read_only,
    )
    return server
