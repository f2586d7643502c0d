"""rag-mcp's resources (seed 001): every collection, one collection, one document, as JSON.

Timestamps are Unix milliseconds. Long texts and lists are cut to the response budget, visibly.
"""

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from kb.errors import ErrorCode, KBError
from kb.selectors.collections import collection_list
from kb.selectors.documents import document_list, document_with_chunks
from mcp_endpoint.budget import drop_to_fit, fit_texts
from mcp_endpoint.caller import current_access
from mcp_endpoint.servers.rag_shapes import collection_settings, document_detail, millis
from mcp_endpoint.tooling import in_thread

P = ParamSpec("P")
MAX_DOCUMENTS_LISTED = 1000
NOT_FOUND = (ErrorCode.DOCUMENT_NOT_FOUND, ErrorCode.COLLECTION_NOT_FOUND)


def json_resource(fn: Callable[P, Any]) -> Callable[P, Awaitable[str]]:
    """A resource reader from a synchronous function: its result as JSON, KBError as a resource error
    carrying rag-mcp's error body (not found: the protocol's invalid-params error)."""

    @functools.wraps(fn)
    async def read(*args: P.args, **kwargs: P.kwargs) -> str:
        try:
            return json.dumps(await in_thread(fn, *args, **kwargs), ensure_ascii=False)
        except KBError as error:
            kind = ResourceNotFoundError if error.code in NOT_FOUND else ResourceError
            raise kind(json.dumps(error.as_dict())) from error

    return read


@json_resource
def all_collections() -> list[dict[str, Any]]:
    """Past the response budget, descriptions are cut visibly; every collection stays listed (a
    client looking one up by name must find it; the list's shape is rag-mcp's, with no room for a
    flag saying some were left out)."""
    access = current_access()
    access.require("read")
    collections = [
        {
            "name": collection.name,
            "description": collection.description,
            "documents": collection.document_total,
            "chunks": collection.chunk_total,
            "created_at": millis(collection.created_at),
            "uuid": str(collection.uuid),
        }
        for collection in collection_list()
        if access.can_see(collection.name)
    ]
    fit_texts(collections, [(collection, "description") for collection in collections])
    return collections


@json_resource
def one_collection(name: str) -> dict[str, Any]:
    access = current_access()
    access.require("read")
    collection = access.collection(name)
    documents = [
        {"id": document.pk, "source_uri": document.source_uri, "content_type": document.content_type}
        for document in document_list(collection=collection, limit=MAX_DOCUMENTS_LISTED)
    ]
    payload = {
        "name": collection.name,
        "description": collection.description,
        "uuid": str(collection.uuid),
        "settings": collection_settings(collection),
        "created_at": millis(collection.created_at),
        "documents": documents,
        "documents_truncated": len(documents) == MAX_DOCUMENTS_LISTED,
    }
    payload["documents_truncated"] = drop_to_fit(documents, payload) or payload["documents_truncated"]
    return payload


@json_resource
def one_document(id: str) -> dict[str, Any]:
    access = current_access()
    access.require("read")
    document, stored = document_with_chunks(access=access, doc_id=id)
    chunks = [
        {
            "id": str(chunk.pk),  # ids are strings in rag-mcp's shapes
            "index": chunk.index,
            "content": chunk.content,
            "tokens": chunk.token_count,
            "lines": chunk.lines,
        }
        for chunk in stored or []
    ]
    payload = {**document_detail(document), "raw_content": document.raw_content, "chunks": chunks}
    payload["truncated"] = bool(fit_texts(payload, [(payload, "raw_content")] + [(c, "content") for c in chunks]))
    return payload


def register(server: MCPServer) -> None:
    json_type = "application/json"
    server.resource(
        "rag://collections", name="collections", description="All collections with statistics", mime_type=json_type
    )(all_collections)
    server.resource(
        "rag://collections/{name}",
        name="collection",
        description="One collection: settings and documents",
        mime_type=json_type,
    )(one_collection)
    server.resource(
        "rag://documents/{id}",
        name="document",
        description="One document: metadata, full text and chunks",
        mime_type=json_type,
    )(one_document)
