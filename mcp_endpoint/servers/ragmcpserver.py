"""The RagMcpServer profile (seed 004): Inject(text, metadata?) stores text, chunked with overlap and
embedded, in the RagMcpServer collection; Query(query) returns the five most similar chunks of the
knowledge base (cosine similarity). Both answer with text, as the seed's server does, and fail with
an error result carrying the message."""

import hashlib
from typing import Annotated, Any

from pydantic import Field

from kb.errors import ErrorCode, KBError
from kb.models import TokenScope
from kb.search import SearchResult, search
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.collections import collection_to_write
from kb.services.documents import document_create_from_text
from kb.services.embedding_pipeline import documents_embed_for_writer
from kb.storable import parse_json
from mcp_endpoint.budget import fit_list
from mcp_endpoint.caller import current_access
from mcp_endpoint.tooling import ADDITIVE, READ_ONLY, KBServer, service_tool, text_error

INJECT_COLLECTION = "RagMcpServer"
QUERY_TOP_K = 5


def metadata_object(metadata: dict[str, Any] | str | None) -> dict[str, Any]:
    """The seed keeps metadata as a JSON string: accept an object, a JSON object string, or plain text."""
    if metadata is None or isinstance(metadata, dict):
        return metadata or {}
    try:
        parsed = parse_json(metadata)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"metadata": metadata}


# The seed's text splitter: about 1,024 tokens a chunk, 128 shared with the next ("Text Splitting").
SEED_CHUNKING = {"chunk_max_tokens": 1024, "chunk_overlap_tokens": 128}


@service_tool(TokenScope.WRITE, collection=INJECT_COLLECTION, on_error=text_error)
def Inject(
    text: Annotated[str, Field(description="The text to add to the knowledge base")],
    metadata: Annotated[
        dict[str, Any] | str | None,
        Field(description="Optional metadata as a JSON object (or JSON string): source file name, timestamps..."),
    ] = None,
) -> str:
    """Accepts text, generates its embeddings and stores it in the knowledge base."""
    if not text.strip():
        raise KBError(ErrorCode.INVALID_ARGUMENT, "The text is empty")
    # Named by content: injecting the same text again is a no-op.
    source_uri = f"inject://{hashlib.sha256(text.encode('utf-8')).hexdigest()[:32]}"
    stored = document_create_from_text(
        collection=collection_to_write(
            name=INJECT_COLLECTION,
            create=current_access().unrestricted,
            description="Text injected by MCP clients",
            **SEED_CHUNKING,
        ),
        source_uri=source_uri,
        text=text,
        metadata=metadata_object(metadata),
    )
    # The seed embeds before it answers: a Query right after finds the text.
    searchable = documents_embed_for_writer(documents=[stored.document])
    note = "" if searchable else f" {STILL_EMBEDDING}"
    return f"Injected document {stored.document.pk} ({stored.document.chunk_count} chunks, {stored.outcome}).{note}"


def passage(result: SearchResult, content: str) -> str:
    return f"[{result.rank}] {result.title or result.source_uri} (similarity {result.similarity or 0.0:.3f})\n{content}"


@service_tool(TokenScope.READ, on_error=text_error)
def Query(query: Annotated[str, Field(description="What to look for")]) -> str:
    """Accepts a query string and returns the five most similar passages of the knowledge base."""
    access = current_access()
    response = search(query=query, collections=access.search_collections(None), top_k=QUERY_TOP_K, mode="semantic")
    if not response.results:
        return "No relevant documents found."
    texts = [{"content": result.content} for result in response.results]
    # The budget holds for the text sent, headers included; the last passages may go too.
    fit_list(texts, "content", measure=lambda shown: len(passages(response.results, shown)))
    return passages(response.results, texts)


def passages(results: list[SearchResult], texts: list[dict[str, str]]) -> str:
    shown = zip(results, texts, strict=False)  # stops at the shorter list: passages left out
    return "\n\n---\n\n".join(passage(result, text["content"]) for result, text in shown)


def build(*, read_only: bool) -> KBServer:
    server = KBServer("RagMcpServer", errors="text")
    server.add_tools([(Inject, ADDITIVE), (Query, READ_ONLY)], read_only=read_only, structured_output=False)
    return server
