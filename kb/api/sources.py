"""Sources: folders or URLs a collection follows; start a sync and follow its run."""

from django.http import HttpRequest
from ninja import Router, Status

from kb.api.auth import access_of
from kb.api.errors import with_errors
from kb.api.schemas import (
    SourceCreateIn,
    SourceListOut,
    SourceName,
    SourceUpdateIn,
    SyncRunId,
    SyncRunListOut,
    SyncStartOut,
)
from kb.errors import ErrorCode
from kb.models import TokenScope
from kb.selectors.sources import SourceOut, SyncRunOut, source_list, sync_runs
from kb.services.sources import source_create, source_delete, source_update, sync_start

router = Router(tags=["sources"])
CREATE_ERRORS = (ErrorCode.COLLECTION_NOT_FOUND, ErrorCode.INVALID_URI, ErrorCode.LOAD_FAILED)


@router.get("/sources", response=with_errors({200: SourceListOut}), summary="List the sources you can see")
def list_sources(request: HttpRequest) -> SourceListOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    sources = [SourceOut.of(source) for source in source_list() if access.can_see(source.collection.name)]
    return SourceListOut(sources=sources, total=len(sources))


@router.post(
    "/sources",
    response=with_errors({201: SourceOut}, *CREATE_ERRORS),
    summary="Create a source: a folder under KB_FILE_ROOTS, or http(s) URLs and/or a sitemap",
    description="It syncs on demand (POST /api/sources/{name}/sync) and, with interval_minutes, on that schedule.",
)
def create_source(request: HttpRequest, payload: SourceCreateIn) -> Status[SourceOut]:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    fields = payload.model_dump()
    source = source_create(collection=access.collection(fields.pop("collection")), **fields)
    return Status(201, SourceOut.of(source))


@router.get("/sources/{name}", response=with_errors({200: SourceOut}, ErrorCode.NOT_FOUND), summary="A source")
def get_source(request: HttpRequest, name: SourceName) -> SourceOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    return SourceOut.of(access.source(name))


@router.patch(
    "/sources/{name}",
    response=with_errors({200: SourceOut}, ErrorCode.NOT_FOUND, *CREATE_ERRORS),
    summary="Change a source: its folder, globs, URLs, schedule or collection (only the fields given)",
    description="The next sync follows the new scope and removes the documents the source brought and no longer "
    "covers. Edit a source rather than delete and create it again: a new source never removes documents "
    "that were there before it.",
)
def update_source(request: HttpRequest, name: SourceName, payload: SourceUpdateIn) -> SourceOut:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    source = access.source(name)
    changes = payload.model_dump(exclude_unset=True)
    if "collection" in changes:
        changes["collection"] = access.collection(changes["collection"])
    return SourceOut.of(source_update(source=source, **changes))


@router.delete(
    "/sources/{name}",
    response=with_errors({204: None}, ErrorCode.NOT_FOUND),
    summary="Stop following a source (its documents stay in the collection)",
)
def delete_source(request: HttpRequest, name: SourceName) -> Status[None]:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    source_delete(source=access.source(name))
    return Status(204, None)


@router.post(
    "/sources/{name}/sync",
    response=with_errors({202: SyncStartOut}, ErrorCode.NOT_FOUND),
    summary="Start a sync (one Celery job); answers at once with the run to follow",
    description="If a sync of the source is already queued or running, that run is returned (`started: false`).",
)
def start_sync(request: HttpRequest, name: SourceName) -> Status[SyncStartOut]:
    access = access_of(request)
    access.require(TokenScope.WRITE)
    start = sync_start(source=access.source(name))
    return Status(202, SyncStartOut(started=start.started, run=SyncRunOut.of(start.run)))


@router.get(
    "/sources/{name}/runs",
    response=with_errors({200: SyncRunListOut}, ErrorCode.NOT_FOUND),
    summary="The source's latest sync runs, newest first",
)
def list_sync_runs(request: HttpRequest, name: SourceName) -> SyncRunListOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    source = access.source(name)
    return SyncRunListOut(source=source.name, runs=[SyncRunOut.of(run) for run in sync_runs(source=source)])


@router.get(
    "/sync-runs/{run_id}",
    response=with_errors({200: SyncRunOut}, ErrorCode.NOT_FOUND),
    summary="A sync run: status and counts (added, updated, unchanged, removed, failed with reasons)",
)
def get_sync_run(request: HttpRequest, run_id: SyncRunId) -> SyncRunOut:
    access = access_of(request)
    access.require(TokenScope.READ)
    return SyncRunOut.of(access.sync_run(run_id))
