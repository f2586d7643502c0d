"""Collections: list, create, get (with totals and settings), update settings, delete."""

from typing import Literal

from django.http import HttpRequest
from ninja import Query, Router, Status

from kb.api.auth import access_of
from kb.api.errors import with_errors
from kb.api.schemas import (
    CollectionCreateIn,
    CollectionDeletedOut,
    CollectionDeleteQuery,
    CollectionName,
    CollectionOut,
    CollectionUpdateIn,
)
from kb.errors import ErrorCode
from kb.models import TokenScope
from kb.selectors.collections import CollectionListing, collection_get_with_totals, collection_list
from kb.services.collections import collection_create, collection_delete, collection_update
from kb.services.model_switch import collection_reembed_cancel, collection_reembed_retry

router = Router(tags=["collections"])
NOT_FOUND = ErrorCode.COLLECTION_NOT_FOUND


@router.get("", response=with_errors({200: CollectionListing}), summary="List the collections you can see")
def list_collections(request: HttpRequest) -> CollectionListing:
    access = access_of(request)
    access.require(TokenScope.READ)
    return CollectionListing.of([c for c in collection_list() if access.can_see(c.name)])


@router.post(
    "",
    response=with_errors({201: CollectionOut}, ErrorCode.COLLECTION_EXISTS),
    summary="Create a collection",
)
def create_collection(request: HttpRequest, payload: CollectionCreateIn) -> Status[CollectionOut]:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    access.require_unrestricted("create collections")
    collection = collection_create(**payload.model_dump())
    return Status(201, CollectionOut.of(collection_get_with_totals(name=collection.name)))


@router.get("/{name}", response=with_errors({200: CollectionOut}, NOT_FOUND), summary="A collection")
def get_collection(request: HttpRequest, name: CollectionName) -> CollectionOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    access.check_collection(name)
    return CollectionOut.of(collection_get_with_totals(name=name))


@router.patch(
    "/{name}",
    response=with_errors({200: CollectionOut}, NOT_FOUND),
    summary="Change a collection's settings or embedding model",
    description="Chunking settings apply to later ingests (re-ingest to re-chunk). A new embedding model is "
    "filled in the background; search keeps the old one until every chunk has a vector of the new one.",
)
def update_collection(request: HttpRequest, name: CollectionName, payload: CollectionUpdateIn) -> CollectionOut:
    access = access_of(request)
    access.require(TokenScope.ADMIN)
    collection_update(collection=access.collection(name), **payload.model_dump())
    return CollectionOut.of(collection_get_with_totals(name=name))


@router.post(
    "/{name}/reembed/{action}",
    response=with_errors({200: CollectionOut}, NOT_FOUND),
    summary="Retry a stopped re-embedding now, or cancel it (the collection stays on its model)",
)
def reembed_collection(request: HttpRequest, name: CollectionName, action: Literal["retry", "cancel"]) -> CollectionOut:
    access = access_of(request)
    access.require(TokenScope.ADMIN)
    collection = access.collection(name)
    if action == "retry":
        collection_reembed_retry(collection=collection)
    else:
        collection_reembed_cancel(collection=collection)
    return CollectionOut.of(collection_get_with_totals(name=name))


@router.delete(
    "/{name}",
    response=with_errors({200: CollectionDeletedOut}, NOT_FOUND),
    summary="Delete a collection with all its documents (confirm=true)",
)
def delete_collection(
    request: HttpRequest, name: CollectionName, query: Query[CollectionDeleteQuery]
) -> CollectionDeletedOut:
    access = access_of(request)
    access.require(TokenScope.ADMIN)
    access.collection(name)  # a hidden collection is "not found", confirmed or not
    deletion = collection_delete(name=name, confirm=query.confirm, how_to_confirm="confirm=true")
    return CollectionDeletedOut(success=True, name=deletion.name, documents=deletion.documents, chunks=deletion.chunks)
