"""Sources: a collection that follows a folder or a list of URLs, synced by one job per run.

A sync compares every file (or URL) with what the collection holds: new and changed ones are
ingested, identical ones cost a read and a hash (a URL a conditional GET), and the documents of
files that are gone are removed, but only after a scan that completed: a folder that cannot be
listed or a sitemap that cannot be fetched removes nothing, a subfolder that cannot be listed
nothing from inside it, and a document written since the run began stays.
What a source brought in, the documents its syncs created, is remembered (``SourceItem``), so
documents that were in the collection before it found them (ingested by other means, or by
another source) are updated by it but never removed.

Runs are rows (``SyncRun``): the database allows one queued or running run per source, a running
run renews a lease, and each worker's sync step (config.celery) gives up runs whose lease
expired (their worker died: nothing was removed), sends again the runs whose message was lost,
and starts the syncs of sources that are due.
"""

import fnmatch
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.ingestion.sources import (
    LoadedSource,
    SkippedSource,
    check_url,
    confine,
    fetch_url,
    fetch_url_if_changed,
    file_path_of,
    load_candidate,
    resolved_path,
    walk_folder,
)
from kb.leases import LeaseKeeper
from kb.models import (
    ACTIVE_SYNC_STATUSES,
    SOURCE_NAME_MAX_LENGTH,
    Collection,
    Document,
    Source,
    SourceItem,
    SourceKind,
    SyncRun,
    SyncStatus,
    is_collection_name,
)
from kb.services.collections import source_rows_lock
from kb.services.documents import collection_index_lock
from kb.services.ingest import ingest_loaded, network_file_roots
from kb.storable import check_storable, storable_text
from kb.task_queue import enqueue_sync
from kb.work_lanes import bulk_work

logger = logging.getLogger(__name__)

MAX_GLOBS = 50
MAX_GLOB_LENGTH = 200
MAX_INTERVAL_MINUTES = 525_600  # a year
FAILURES_KEPT = 100
# A running run writes its counts and renews its lease at most this often.
PROGRESS_SECONDS = 0.5


def source_file_roots() -> list[Path]:
    """The folders a source may follow: KB_FILE_ROOTS, for every door, since the worker reads them."""
    return network_file_roots()


# --- creating and changing sources ------------------------------------------------------------


def source_create(
    *,
    collection: Collection,
    name: str,
    folder: str = "",
    recursive: bool = True,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    urls: Sequence[str] = (),
    sitemap_url: str = "",
    interval_minutes: int | None = None,
) -> Source:
    """A folder under KB_FILE_ROOTS, or http(s) URLs and/or a sitemap, that ``collection`` follows.
    With ``interval_minutes`` it syncs on that schedule, the first time at the workers' next step."""
    fields = validate_source_fields(
        name=name,
        folder=folder,
        recursive=recursive,
        include=include,
        exclude=exclude,
        urls=urls,
        sitemap_url=sitemap_url,
        interval_minutes=interval_minutes,
    )
    try:
        with transaction.atomic():
            return Source.objects.create(collection=collection, next_sync_at=_first_sync(interval_minutes), **fields)
    except IntegrityError:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"A source named {name!r} already exists") from None


SOURCE_FIELDS = ("name", "folder", "recursive", "include", "exclude", "urls", "sitemap_url", "interval_minutes")


def source_update(*, source: Source, **changes: Any) -> Source:
    """Change a source's scope or schedule (the same checks as ``source_create``); the next sync
    follows the new scope and removes the documents the source no longer covers. The changes
    apply to the row as it is now (locked): concurrent changes of other fields are kept."""
    unknown = set(changes) - set(SOURCE_FIELDS) - {"collection"}
    if unknown:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Sources have no field {sorted(unknown)[0]!r}")
    collection = changes.pop("collection", None)
    try:
        with transaction.atomic():
            locked = Source.objects.select_for_update().filter(pk=source.pk).first()
            if locked is None:
                raise KBError(ErrorCode.NOT_FOUND, f"Source not found: {source.name}")
            current = {name: getattr(locked, name) for name in SOURCE_FIELDS}
            fields = validate_source_fields(**{**current, **changes})
            if fields["interval_minutes"] != locked.interval_minutes:
                locked.next_sync_at = _first_sync(fields["interval_minutes"])
            if collection is not None and collection.pk != locked.collection_id:
                # Locked against its deletion (which waits for this, then takes the source along).
                if not Collection.objects.select_for_update(no_key=True).filter(pk=collection.pk).exists():
                    raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {collection.name}")
                locked.items.all().delete()  # what it brought to the other collection stays there
                locked.collection = collection
            for key, value in fields.items():
                setattr(locked, key, value)
            locked.save()
            return locked
    except IntegrityError:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"A source named {changes.get('name')!r} already exists") from None


def source_changes(*, on_demand: bool = False, **given: Any) -> dict[str, Any]:
    """The changes to a source that a door was given, where None means "left as it is" (MCP, the
    command line); ``on_demand`` stops its schedule, which an interval cannot say at once."""
    changes = {key: value for key, value in given.items() if value is not None}
    if on_demand:
        if "interval_minutes" in changes:
            raise KBError(ErrorCode.INVALID_ARGUMENT, "Give an interval or on demand, not both")
        changes["interval_minutes"] = None
    return changes


def source_delete(*, source: Source) -> None:
    """Stop following the source; the documents it brought stay in the collection."""
    with transaction.atomic():
        source_rows_lock(Source.objects.filter(pk=source.pk))
        Source.objects.filter(pk=source.pk).delete()


def validate_source_fields(
    *,
    name: str,
    folder: str,
    recursive: bool,
    include: Sequence[str],
    exclude: Sequence[str],
    urls: Sequence[str],
    sitemap_url: str,
    interval_minutes: int | None,
) -> dict[str, Any]:
    """A source's fields as stored, or the KBError that says what is wrong (every door's check)."""
    if not is_collection_name(name) or len(name) > SOURCE_NAME_MAX_LENGTH:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Invalid source name {str(name)[:120]!r}: use letters, digits, '-' and '_' only "
            f"(at most {SOURCE_NAME_MAX_LENGTH})",
        )
    folder = (folder or "").strip()
    sitemap_url = (sitemap_url or "").strip()
    check_storable([folder, sitemap_url], what="folder and sitemap URL")
    urls = _checked_urls(urls)
    if folder and (urls or sitemap_url):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "A source follows a folder or URLs, not both")
    if not (folder or urls or sitemap_url):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "A source needs a folder, URLs or a sitemap URL")
    if sitemap_url:
        check_url(sitemap_url)
    whole_minutes = isinstance(interval_minutes, int) and not isinstance(interval_minutes, bool)
    if interval_minutes is not None and not (whole_minutes and 1 <= interval_minutes <= MAX_INTERVAL_MINUTES):
        raise KBError(
            ErrorCode.INVALID_ARGUMENT, f"interval_minutes must be between 1 and {MAX_INTERVAL_MINUTES}, or none"
        )
    return {
        "name": name,
        "kind": SourceKind.FOLDER if folder else SourceKind.URLS,
        "folder": str(_checked_folder(folder)) if folder else "",
        "recursive": bool(recursive),
        "include": _checked_globs(include, "include"),
        "exclude": _checked_globs(exclude, "exclude"),
        "urls": urls,
        "sitemap_url": sitemap_url,
        "interval_minutes": interval_minutes,
    }


def _checked_folder(folder: str) -> Path:
    if not source_file_roots():
        raise KBError(
            ErrorCode.INVALID_URI,
            "Folder sources need KB_FILE_ROOTS: set it to the directories they may follow (the worker reads them too)",
        )
    path = confine(file_path_of(folder), source_file_roots())
    if not path.is_dir():
        raise KBError(ErrorCode.INVALID_URI, f"{folder} is not a folder")
    check_storable(str(path), what="folder")  # its real path, which links may name differently
    return path


def _checked_globs(globs: Sequence[str], what: str) -> list[str]:
    if isinstance(globs, str) or not all(isinstance(glob, str) for glob in globs):
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"{what} must be a list of glob patterns")
    cleaned = [glob.strip() for glob in globs if glob.strip()]
    if len(cleaned) > MAX_GLOBS or any(len(glob) > MAX_GLOB_LENGTH for glob in cleaned):
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"{what}: at most {MAX_GLOBS} patterns of at most {MAX_GLOB_LENGTH} characters each",
        )
    check_storable(cleaned, what=what)
    return cleaned


def _checked_urls(urls: Sequence[str]) -> list[str]:
    if isinstance(urls, str) or not all(isinstance(url, str) for url in urls):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "urls must be a list of http(s) URLs")
    unique = list(dict.fromkeys(url.strip() for url in urls if url.strip()))
    check_storable(unique, what="urls")
    if len(unique) > settings.KB_SOURCE_MAX_URLS:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"A source may follow at most {settings.KB_SOURCE_MAX_URLS} URLs (KB_SOURCE_MAX_URLS)",
        )
    for url in unique:
        check_url(url)
    return unique


def _first_sync(interval_minutes: int | None) -> Any:
    return timezone.now() if interval_minutes else None


# --- starting runs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyncStart:
    run: SyncRun
    started: bool  # False: a run of the source was already queued or running; this is it


def sync_start(*, source: Source, trigger: str = "manual") -> SyncStart:
    """Queue a sync of ``source``, or return the one already queued or running (never two)."""
    with transaction.atomic():
        locked = Source.objects.select_for_update().filter(pk=source.pk).first()
        if locked is None:  # deleted since the door found it
            raise KBError(ErrorCode.NOT_FOUND, f"Source not found: {source.name}")
        if locked.interval_minutes:  # the schedule counts from the latest sync asked for, whoever asked
            locked.next_sync_at = timezone.now() + timedelta(minutes=locked.interval_minutes)
            locked.save(update_fields=["next_sync_at", "updated_at"])
        active = locked.runs.filter(status__in=ACTIVE_SYNC_STATUSES).first()
        if active is not None:
            return SyncStart(run=active, started=False)
        run = SyncRun.objects.create(
            source=locked,
            trigger=trigger,
            collection_name=locked.collection.name,
            lease_expires_at=_resend_deadline(),
        )
        enqueue_sync(run.pk)
    return SyncStart(run=run, started=True)


def sync_tick() -> None:
    """A worker's periodic step: give up runs whose worker died, send again the runs whose task
    message was lost, start the sources that are due. Every worker runs it; the row locks and the
    one-active-run rule make that safe."""
    now = timezone.now()
    SyncRun.objects.filter(status=SyncStatus.RUNNING, lease_expires_at__lt=now).update(
        status=SyncStatus.FAILED,
        error="The worker running this sync stopped before it finished; nothing was removed",
        finished_at=now,
        lease_expires_at=None,
    )
    for run_id in SyncRun.objects.filter(status=SyncStatus.QUEUED, lease_expires_at__lt=now).values_list(
        "pk", flat=True
    ):
        SyncRun.objects.filter(pk=run_id, status=SyncStatus.QUEUED).update(lease_expires_at=_resend_deadline())
        enqueue_sync(run_id)
    for source in Source.objects.filter(interval_minutes__isnull=False, next_sync_at__lte=now):
        with transaction.atomic():
            due = Source.objects.select_for_update(skip_locked=True).filter(pk=source.pk, next_sync_at__lte=now)
            if due.exists():
                sync_start(source=source, trigger="schedule")


def _resend_deadline() -> Any:
    """When a run still queued counts as having lost its task message."""
    return timezone.now() + timedelta(seconds=settings.KB_SYNC_LEASE_SECONDS * 5)


# --- running a sync -----------------------------------------------------------------------------


class _RunTakenAway(Exception):
    """The run's lease expired and it was given up while this worker still worked on it."""


class _SourceMoved(Exception):
    """The source was moved to another collection while the run worked on it: the run stops."""


class _SourceGone(Exception):
    """The source (or its collection, which takes the source and its runs with it) was deleted
    while the run worked on it: the run stops, with nothing left to report to."""


@dataclass
class _Scan:
    """What a sync found: the items to compare, and whether the listing was complete."""

    candidates: list[Any]
    problems: list[str] = field(default_factory=list)
    folder: Path | None = None  # a folder source's folder, resolved
    # A folder source's subfolders that could not be listed: the documents from inside them stay.
    unlisted: list[Path] = field(default_factory=list)
    _unlisted_prefixes: tuple[str, ...] | None = None

    def removable(self, uri: str) -> bool:
        """Whether the document of ``uri``, which the scan did not find, may be removed: when the
        scan was complete, or when only subfolders of the folder could not be listed and it lay in
        none of them. One unreadable subfolder (or a path too long to open) had kept a source from
        removing anything, for as long as it stayed."""
        if self.folder is None or self.folder in self.unlisted:
            return not self.problems
        if self._unlisted_prefixes is None:  # once: a sync asks for every file it did not find
            self._unlisted_prefixes = tuple(f"{folder.as_uri()}/" for folder in self.unlisted)
        return not uri.startswith(self._unlisted_prefixes)


class _Progress:
    """A running run's counts, written to its row every PROGRESS_SECONDS."""

    def __init__(self, run: SyncRun, lease: LeaseKeeper) -> None:
        self.run = run
        self.lease = lease
        self._written = 0.0

    def count(self, outcome: str, uri: str = "", error: KBError | None = None) -> None:
        setattr(self.run, outcome, getattr(self.run, outcome) + 1)
        if outcome == "failed" and error is not None and len(self.run.failures) < FAILURES_KEPT:
            uri, message = storable_text(uri, limit=2000), storable_text(error.message, limit=500)
            self.run.failures.append({"uri": uri, "code": str(error.code), "message": message})

    def item_done(self) -> None:
        self.run.processed += 1
        if self.lease.lost:
            raise _RunTakenAway()
        if time.monotonic() - self._written >= PROGRESS_SECONDS:
            self.write()

    def write(self, **final: Any) -> None:
        fields = ["total", "processed", "added", "updated", "unchanged", "removed", "skipped", "failed", "failures"]
        values = {name: getattr(self.run, name) for name in fields}
        if final:
            values["lease_expires_at"] = None
        written = SyncRun.objects.filter(pk=self.run.pk, status=SyncStatus.RUNNING).update(**values, **final)
        if not written:
            raise _RunTakenAway() if SyncRun.objects.filter(pk=self.run.pk).exists() else _SourceGone()
        self._written = time.monotonic()


def sync_execute(*, run_id: str, worker: str = "") -> SyncRun | None:
    """Run a queued sync (the worker's task): None when it is not queued any more (another
    worker has it, or it finished)."""
    now = timezone.now()
    claimed = SyncRun.objects.filter(pk=run_id, status=SyncStatus.QUEUED).update(
        status=SyncStatus.RUNNING,
        started_at=now,
        worker=worker[:255],
        lease_expires_at=now + timedelta(seconds=settings.KB_SYNC_LEASE_SECONDS),
    )
    if not claimed:
        return None
    run = SyncRun.objects.select_related("source__collection").get(pk=run_id)
    if run.collection_name != run.source.collection.name:  # the source moved while the run was queued
        run.collection_name = run.source.collection.name
        SyncRun.objects.filter(pk=run_id).update(collection_name=run.collection_name)
    keeper = LeaseKeeper(
        lambda: _renew_lease(run_id), every=settings.KB_SYNC_LEASE_SECONDS / 3, name=f"sync-lease-{run_id}"
    )
    progress = _Progress(run, keeper)
    gone: dict[str, str] = {}
    keeper.start()
    try:
        with bulk_work():
            gone = _sync(run.source, progress)
    except _RunTakenAway:
        return _given_up(run_id)
    except _SourceGone:
        return _source_gone(run_id)
    except _SourceMoved:
        run.error = "The source was moved to another collection while it ran; it stopped there, nothing was removed"
    except KBError as error:  # the scan could not start: the folder is gone, outside the roots...
        run.error = f"{error.message}; nothing was removed"
    except DatabaseError:
        raise  # the database may be gone: the lease expires and the next sync step gives the run up
    except Exception as error:
        logger.exception("sync run %s failed unexpectedly", run_id)
        run.error = f"Internal error: {error!r}; nothing was removed"
    finally:
        keeper.stop()
    try:
        # Removal and the run's end commit together: a run given up meanwhile removes nothing.
        with transaction.atomic():
            locked = Source.objects.select_for_update().filter(pk=run.source.pk).first()
            if locked is None:
                raise _SourceGone()
            if gone and _scope(locked) != _scope(run.source):
                run.error = "The source was changed while it ran; nothing was removed"
                gone = {}
            run.removed = _remove(run.source, gone)
            status = SyncStatus.SUCCEEDED if not run.error else SyncStatus.FAILED
            progress.write(status=status, error=run.error, finished_at=timezone.now())
    except _RunTakenAway:
        return _given_up(run_id)
    except _SourceGone:
        return _source_gone(run_id)
    run.refresh_from_db()
    return run


def _scope(source: Source) -> tuple:
    """What decides which documents a source's scan finds, and where they are."""
    fields = ("collection_id", "folder", "recursive", "include", "exclude", "urls", "sitemap_url")
    return tuple(getattr(source, name) for name in fields)


def _renew_lease(run_id: str) -> bool:
    lease = timezone.now() + timedelta(seconds=settings.KB_SYNC_LEASE_SECONDS)
    return bool(SyncRun.objects.filter(pk=run_id, status=SyncStatus.RUNNING).update(lease_expires_at=lease))


def _source_gone(run_id: str) -> None:
    logger.info("sync run %s stopped: its source or collection was deleted while it ran", run_id)


def _given_up(run_id: str) -> SyncRun:
    logger.warning("sync run %s was given up while it ran (its lease expired); it removed nothing", run_id)
    return SyncRun.objects.get(pk=run_id)


def _sync(source: Source, progress: _Progress) -> dict[str, str]:
    """Compare and ingest every item the scan finds; the documents to remove, each with the content
    hash it had before the scan (none unless the scan completed, or only parts of a folder could
    not be listed)."""
    run = progress.run
    held = dict(source.items.values_list("document_id", "document__content_hash"))
    scan = _scan_folder(source) if source.kind == SourceKind.FOLDER else _scan_urls(source)
    run.total = len(scan.candidates)
    progress.write()
    items = {item.uri: item for item in source.items.all()}
    seen: set[str] = set()
    for candidate in scan.candidates:
        if scan.folder:
            seen.update(_sync_file(source, scan.folder, candidate, items, progress))
        else:
            seen.add(_sync_url(source, candidate, items, progress))
        progress.item_done()
    gone = {
        item.document_id: held[item.document_id]
        for uri, item in items.items()
        if uri not in seen and scan.removable(uri) and item.document_id in held
    }
    if scan.problems:
        partial = scan.folder is not None and scan.folder not in scan.unlisted
        kept = "nothing inside it was removed" if partial else "nothing was removed"
        run.error = f"{scan.problems[0]}; {kept}" + (
            f" ({len(scan.problems) - 1} more)" if len(scan.problems) > 1 else ""
        )
    return gone


def _remove(source: Source, gone: dict[str, str]) -> int:
    """Remove the source's documents a scan no longer found (``gone``: each one's content hash
    before the scan) that still hold that content; the documents removed. One written since (its
    file put back and ingested by a caller meanwhile) stays: the run had deleted it, although the
    caller had been told it was stored."""
    if not gone:
        return 0
    collection_index_lock(collection_id=source.collection_id)  # in the order writers take: none writes now
    current = Document.objects.filter(collection=source.collection, pk__in=list(gone))
    found_again = _finder(source) if source.kind == SourceKind.FOLDER else lambda uri: False
    unchanged = [
        doc_id
        for doc_id, digest, uri in current.values_list("pk", "content_hash", "source_uri")
        if gone[doc_id] == digest and not found_again(uri)
    ]
    # The records go with their documents (SourceItem.document).
    _, deleted = Document.objects.filter(pk__in=unchanged).delete()
    return deleted.get(Document._meta.label, 0)


def _finder(source: Source) -> Callable[[str], bool]:
    """Whether a scan of the folder source would find a file now: one put back as it was (and
    ingested again as unchanged by a caller) while the run worked had been deleted by it."""
    try:
        folder = confine(Path(source.folder), source_file_roots())
    except KBError:
        return lambda uri: False

    def found(uri: str) -> bool:
        try:
            path = file_path_of(uri)
            if not os.path.lexists(path):
                return False
            relative = _seen_from(folder, path)
        except (KBError, ValueError, OSError):  # not a file of the folder (any more)
            return False
        within = source.recursive or len(relative.parts) == 1
        return within and _selected(relative, source.include, source.exclude)

    return found


def _scan_folder(source: Source) -> _Scan:
    folder = confine(Path(source.folder), source_file_roots())  # the roots may have changed since
    scan = _Scan(candidates=[], folder=folder)

    def unreadable(error: OSError) -> None:
        scan.unlisted.append(Path(os.fsdecode(error.filename)) if error.filename else folder)
        scan.problems.append(f"Cannot list {error.filename}: {error.strerror}")

    scan.candidates = [
        path
        for path in walk_folder(folder, recursive=source.recursive, on_error=unreadable)
        if _selected(_seen_from(folder, path), source.include, source.exclude)
    ]
    return scan


def _seen_from(folder: Path, path: Path) -> Path:
    """A file's path relative to the folder, for the globs: where a link inside the folder leads
    (the document is that file's: a link to an excluded file is excluded), else where it lies."""
    real = resolved_path(path)
    return (real if real and real.is_relative_to(folder) else path).relative_to(folder)


_ANY_FOLDERS = re.compile(r"(^|/)\*\*/")


def _selected(relative: Path, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether a file's path relative to the folder passes the globs. A pattern matches the whole
    relative path (``*`` crosses folders: ``docs/*``, ``*/drafts/*``) or, without a ``/``, the
    file name alone (``*.md``). ``**/`` also stands for no folder at all, as in .gitignore:
    ``**/*.md`` is every Markdown file, those at the top too."""
    path = PurePosixPath(relative).as_posix()

    def matches(pattern: str) -> bool:
        whole = any(fnmatch.fnmatchcase(path, variant) for variant in {pattern, _ANY_FOLDERS.sub(r"\1", pattern)})
        return whole or ("/" not in pattern and fnmatch.fnmatchcase(relative.name, pattern))

    return (not include or any(map(matches, include))) and not any(map(matches, exclude))


def _sync_file(source: Source, folder: Path, path: Path, items: dict[str, SourceItem], progress: _Progress) -> set[str]:
    """Ingest one file if it is new or changed; the URIs it accounts for. A link that leads out
    of the folder is not the source's to follow (nor is the document of the file it leads to)."""
    loaded = load_candidate(path, roots=source_file_roots(), within=folder)
    if isinstance(loaded, SkippedSource):
        # A file that could not be read is still there: its document must not be removed (nor the
        # one of the file a link leads to).
        real = resolved_path(path)
        progress.count("skipped" if loaded.unsupported else "failed", loaded.source_uri, loaded.error)
        return {loaded.source_uri, *([real.as_uri()] if real else [])}
    _ingest(source, loaded, items, progress)
    return {loaded.source_uri}


def _sync_url(source: Source, url: str, items: dict[str, SourceItem], progress: _Progress) -> str:
    item = items.get(url)
    held = Document.objects.filter(collection=source.collection, source_uri=url).exists()
    try:
        if item is not None and held:
            loaded = fetch_url_if_changed(url, etag=item.etag, last_modified=item.last_modified)
        else:
            loaded = fetch_url(url)
    except KBError as error:
        progress.count("failed", url, error)
        return url
    if loaded is None:
        progress.count("unchanged")
        return url
    _ingest(source, loaded, items, progress)
    return url


OUTCOME_COUNTERS = {"created": "added", "updated": "updated", "unchanged": "unchanged"}


def _ingest(source: Source, loaded: LoadedSource, items: dict[str, SourceItem], progress: _Progress) -> None:
    try:
        # The document and the record that the source brought it commit together: a worker killed
        # between the two had left a document no later sync would remove.
        with transaction.atomic():
            stored = ingest_loaded(collection=source.collection, source=loaded)
            _check_still_in(source)
            _remember(source, loaded, stored.document, stored.outcome, items)
    except KBError as error:
        progress.count("failed", loaded.source_uri, error)
        return
    except IntegrityError:
        if not Source.objects.filter(pk=source.pk).exists():
            raise _SourceGone() from None
        raise
    progress.count(OUTCOME_COUNTERS[stored.outcome])


def _check_still_in(source: Source) -> None:
    """Raise _SourceMoved when the source has moved to another collection since the run began (its
    document must not be written to the old one, nor recorded as the source's in the new one), and
    hold the source's row until the write commits: a move or a deletion waits for it. Taken after
    the document's write, which holds the collection first, in the order a deletion takes them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT collection_id FROM kb_source WHERE id = %s FOR SHARE", [source.pk])
        row = cursor.fetchone()
    if row is None:
        raise _SourceGone()
    if row[0] != source.collection_id:
        raise _SourceMoved()


def _remember(
    source: Source, loaded: LoadedSource, document: Document, outcome: str, items: dict[str, SourceItem]
) -> None:
    uri, etag, last_modified = loaded.source_uri, loaded.etag, loaded.last_modified
    item = items.get(uri)
    if outcome == "created":
        # The source's own, also where a record named a document deleted since (the record went
        # with it, kb.models.SourceItem).
        items[uri], _ = SourceItem.objects.update_or_create(
            source=source, uri=uri, defaults={"document": document, "etag": etag, "last_modified": last_modified}
        )
    elif item is not None and (item.etag, item.last_modified) != (etag, last_modified):
        item.etag, item.last_modified = etag, last_modified
        SourceItem.objects.filter(pk=item.pk).update(etag=etag, last_modified=last_modified)
    # Otherwise a document that was there before the source found it (ingested by hand, by an
    # agent, by another source) is updated but never the source's: its removal is not the source's
    # to decide. A curator allowed only to edit sources had deleted others' documents so.


def _scan_urls(source: Source) -> _Scan:
    urls = list(source.urls)
    problems: list[str] = []
    if source.sitemap_url:
        try:
            pages, partial = sitemap_urls(source.sitemap_url)
        except KBError as error:
            problems.append(f"The sitemap could not be read: {error.message}")
        else:
            urls.extend(pages)
            problems.extend(partial)
    unique = list(dict.fromkeys(urls))
    if len(unique) > settings.KB_SOURCE_MAX_URLS:
        problems.append(f"More than {settings.KB_SOURCE_MAX_URLS} URLs (KB_SOURCE_MAX_URLS); the rest were not synced")
    return _Scan(candidates=unique[: settings.KB_SOURCE_MAX_URLS], problems=problems)


SITEMAP_NAMESPACE = "{http://www.sitemaps.org/schemas/sitemap/0.9}"


def sitemap_urls(url: str) -> tuple[list[str], list[str]]:
    """The http(s) page URLs of a sitemap (``<urlset>``), or of the sitemaps a sitemap index lists
    (the first KB_SOURCE_MAX_SITEMAPS, one level deep), at most KB_SOURCE_MAX_URLS + 1 of them; and
    what was left unread (a scan that left something out removes nothing). Fetched with
    ingestion's guards; parsed without entities, DTDs or network access."""
    limit = settings.KB_SOURCE_MAX_URLS + 1
    kind, locations, problems = _sitemap_locations(url)
    if kind != "sitemapindex":
        return locations[:limit], problems
    pages: list[str] = []
    most = settings.KB_SOURCE_MAX_SITEMAPS
    if len(locations) > most:
        listed = len(locations)
        problems.append(
            f"The sitemap index lists {listed} sitemaps; only the first {most} were read (KB_SOURCE_MAX_SITEMAPS)"
        )
    for nested in locations[:most]:
        if len(pages) >= limit:
            break
        nested_kind, nested_pages, nested_problems = _sitemap_locations(nested)
        problems.extend(nested_problems)
        if nested_kind == "urlset":
            pages.extend(nested_pages)
        else:
            problems.append(f"{nested} is a sitemap index inside a sitemap index; it was not read")
    return pages[:limit], problems


def _sitemap_locations(url: str) -> tuple[str, list[str], list[str]]:
    """The sitemap's kind, its absolute http(s) locations, and what it lists that is not one (a
    relative path, an entity left unexpanded, another scheme): a page the scan cannot name must not
    look like a page dropped from the site, whose document a sync removes."""
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    try:
        root = etree.fromstring(fetch_url(url).data, parser=parser)
    except etree.XMLSyntaxError as error:
        raise KBError(ErrorCode.LOAD_FAILED, f"{url} is not a sitemap: {error}") from None
    kind = etree.QName(root).localname
    if kind not in ("urlset", "sitemapindex"):
        raise KBError(ErrorCode.LOAD_FAILED, f"{url} is not a sitemap (its root element is <{kind}>)")
    locations, unusable = [], []
    for element in root.iter(f"{SITEMAP_NAMESPACE}loc", "loc"):
        location = (element.text or "").strip()
        try:
            parts = urllib.parse.urlsplit(location)
        except ValueError:  # "http://[::1": a bracket that never closes
            unusable.append(location)
            continue
        if parts.scheme in ("http", "https") and parts.netloc:  # urlsplit lower-cases the scheme: HTTP:// too
            locations.append(parts.scheme + location[len(parts.scheme) :])
        else:
            unusable.append(location)
    if not unusable:
        return kind, locations, []
    shown = repr(unusable[0][:200])
    return kind, locations, [f"{url} lists {len(unusable)} <loc> that is no absolute http(s) URL (the first: {shown})"]
