"""The Synthesis profile (seed 003): search_rag by collection UUID with min_similarity, collection and
document management, deletes that refuse without ``confirm: true``.

As the seed's server does, every tool answers with its result as indented JSON text (no structured
content) and fails with an error result carrying the message; arguments are validated against the
seed's constraints (UUID, query not empty, top_k 1-50, min_similarity 0-1).
"""

import json
from typing import Annotated, Any

from pydantic import Field, Strict

from kb.errors import ErrorCode, KBError
from kb.models import Collection, Document, TokenScope
from kb.search import search
from kb.selectors.collections import collection_get_by_uuid, collection_list
from kb.selectors.documents import MAX_PAGE_SIZE, document_list
from kb.selectors.ingestion import STILL_EMBEDDING
from kb.services.collections import collection_create, collection_delete
from kb.services.documents import document_delete
from kb.services.embedding_pipeline import documents_embed_for_writer
from kb.services.ingest import document_ingest
from mcp_endpoint.budget import fit_list
from mcp_endpoint.caller import current_access
from mcp_endpoint.tooling import (
    CREATING,
    DESTRUCTIVE,
    FETCHING,
    READ_ONLY,
    KBServer,
    service_tool,
    text_error,
)

# The seed validates with zod, which coerces nothing: "5" is not a number, "true" or 1 not a boolean.
CollectionId = Annotated[
    str, Strict(), Field(description="The collection's UUID", json_schema_extra={"format": "uuid"})
]
Confirm = Annotated[bool, Strict(), Field(description="Must be true to delete")]


def json_text(payload: Any) -> str:
    return json.dumps(payload, indent=2, ensure_ascii=False, default=str)


def text_size(payload: Any) -> int:
    """What the response budget counts of a tool answering in JSON text: the text sent."""
    return len(json_text(payload))


def visible_collection(collection_id: str) -> Collection:
    collection = collection_get_by_uuid(collection_uuid=collection_id)
    if not current_access().can_see(collection.name):
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection_id}")
    return collection


def require_confirmation(confirm: bool, what: str) -> None:
    if not confirm:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Refusing to delete {what} without confirm: true")


def collection_json(collection: Collection, document_count: int) -> dict[str, Any]:
    return {
        "id": str(collection.uuid),
        "name": collection.name,
        "description": collection.description,
        "document_count": document_count,
        "created_at": collection.created_at.isoformat(),
    }


def document_json(document: Document) -> dict[str, Any]:
    return {
        "id": document.pk,
        "title": document.title,
        "source_url": document.source_uri,
        "content_type": document.content_type,
        "status": document.status,
        "chunk_count": document.chunk_count,
        "created_at": document.created_at.isoformat(),
    }


@service_tool(TokenScope.READ, on_error=text_error)
def search_rag(
    collectionId: CollectionId,
    query: Annotated[str, Field(min_length=1, description="What to search for")],
    top_k: Annotated[int, Strict(), Field(ge=1, le=50, description="Number of chunks to return")] = 5,
    min_similarity: Annotated[
        float, Strict(), Field(ge=0.0, le=1.0, description="Lowest cosine similarity to return")
    ] = 0.5,
) -> str:
    """Search the RAG knowledge base for relevant information and return matching chunks with citations."""
    collection = visible_collection(collectionId)
    response = search(
        query=query, collections=[collection.name], top_k=top_k, mode="semantic", min_similarity=min_similarity
    )
    results = [
        {
            "content": result.content,
            "similarity": result.similarity,
            "document_id": result.document_id,
            "document_title": result.title,
            "source_url": result.source_uri,
            "chunk_index": result.chunk_index,
            "citation": {"title": result.title or result.source_uri, "url": result.source_uri, "lines": result.lines},
        }
        for result in response.results
    ]
    payload = {"query": response.query, "collectionId": str(collection.uuid), "results": results}
    fit_list(results, "content", envelope=payload, measure=text_size)
    return json_text(payload)


@service_tool(TokenScope.READ, on_error=text_error)
def list_collections() -> str:
    """Lists all available document collections."""
    access = current_access()
    collections = [collection_json(c, c.document_total) for c in collection_list() if access.can_see(c.name)]
    payload = {"collections": collections, "truncated": False}
    payload["truncated"] = fit_list(collections, "description", envelope=payload, measure=text_size)
    return json_text(payload)


@service_tool(TokenScope.READ, on_error=text_error)
def list_documents(collection_id: CollectionId) -> str:
    """Lists all documents within a given collection."""
    collection = visible_collection(collection_id)
    documents = [document_json(d) for d in document_list(collection=collection, limit=MAX_PAGE_SIZE)]
    full_page = len(documents) == MAX_PAGE_SIZE
    payload = {"collection_id": collection_id, "documents": documents, "truncated": full_page}
    payload["truncated"] = fit_list(documents, "source_url", envelope=payload, measure=text_size) or full_page
    return json_text(payload)


@service_tool(TokenScope.WRITE, every_collection_to="create collections", on_error=text_error)
def create_collection(
    name: Annotated[str, Field(description="Collection name (letters, digits, '-' and '_')")],
    description: Annotated[str, Field(description="What the collection holds")],
) -> str:
    """Creates a new, empty collection."""
    return json_text({"collection": collection_json(collection_create(name=name, description=description), 0)})


@service_tool(TokenScope.WRITE, on_error=text_error)
def fetch_and_add_document_from_url(
    url: Annotated[str, Field(description="A public http(s) URL")],
    collection_id: CollectionId,
) -> str:
    """Fetches content from a public URL and ingests it as a new document."""
    if not url.startswith(("http://", "https://")):
        raise KBError(ErrorCode.INVALID_URI, f"Not an http(s) URL: {url[:200]}")
    collection = visible_collection(collection_id)
    (item,) = document_ingest(collection=collection, uri=url, file_roots=[]).items
    searchable = documents_embed_for_writer(documents=[item.document])
    answer = {"document": document_json(item.document), "outcome": item.outcome}
    return json_text(answer if searchable else {**answer, "note": STILL_EMBEDDING})


@service_tool(TokenScope.WRITE, on_error=text_error)
def delete_document(doc_id: Annotated[str, Field(description="The document ID")], confirm: Confirm) -> str:
    """Deletes a document and its associated data. Requires confirmation flag."""
    current_access().document(doc_id)
    require_confirmation(confirm, f"document {doc_id}")
    document = document_delete(doc_id=doc_id)
    return json_text({"success": True, "deleted": {"id": document.pk, "title": document.title}})


@service_tool(TokenScope.ADMIN, on_error=text_error)
def delete_collection(collection_id: CollectionId, confirm: Confirm) -> str:
    """Deletes an entire collection. Requires confirmation flag. Use with caution."""
    collection = visible_collection(collection_id)
    deletion = collection_delete(name=collection.name, confirm=confirm)
    return json_text(
        {"success": True, "deleted": {"id": collection_id, "name": deletion.name, "documents": deletion.documents}}
    )


def build(*, read_only: bool) -> KBServer:
    server = KBServer("synthesis-rag", version="1.0.0", errors="text", input_schema_in_meta=True, closed_arguments=True)
    server.add_tools(
        [
            (search_rag, READ_ONLY),
            (list_collections, READ_ONLY),
            (list_documents, READ_ONLY),
            (create_collection, CREATING),
            (fetch_and_add_document_from_url, FETCHING),
            (delete_document, DESTRUCTIVE),
            (delete_collection, DESTRUCTIVE),
        ],
        read_only=read_only,
        structured_output=False,
    )
    return server
