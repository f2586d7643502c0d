"""Sources and their sync runs, and the one shape every door shows them in (REST, MCP, ``kb_sync --json``)."""

from datetime import datetime

from django.db.models import QuerySet
from pydantic import BaseModel, ConfigDict, Field

from kb.errors import ErrorCode, KBError, refuse_nul
from kb.models import Source, SyncRun, SyncStatus, SyncStatusName
from kb.selectors.documents import ULID_FORM

RUNS_SHOWN = 20


class SyncFailure(BaseModel):
    uri: str
    code: str
    message: str


class SyncRunOut(BaseModel):
    """A sync run: its state, and what it found so far."""

    model_config = ConfigDict(frozen=True)

    job_id: str = Field(description="The run's id (rag_sync_status, GET /api/sync-runs/{id})")
    source: str
    collection: str
    status: SyncStatusName
    done: bool = Field(description="True once it succeeded or failed")
    trigger: str = Field(description="manual or schedule")
    total: int = Field(description="Files or URLs the scan found")
    processed: int
    added: int
    updated: int
    unchanged: int
    removed: int
    skipped: int = Field(description="Files of a type that is not supported")
    failed: int
    failures: list[SyncFailure] = Field(description="Why items failed (the first 100)")
    error: str = Field(description="Why the run failed as a whole (what was not removed because of it)")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_seconds: float | None

    @classmethod
    def of(cls, run: SyncRun) -> "SyncRunOut":
        ended = run.finished_at
        duration = (ended - run.started_at).total_seconds() if ended and run.started_at else None
        return cls(
            job_id=run.pk,
            source=run.source.name,
            collection=run.collection_name,
            status=run.status,
            done=run.status in (SyncStatus.SUCCEEDED, SyncStatus.FAILED),
            trigger=run.trigger,
            total=run.total,
            processed=run.processed,
            added=run.added,
            updated=run.updated,
            unchanged=run.unchanged,
            removed=run.removed,
            skipped=run.skipped,
            failed=run.failed,
            failures=[SyncFailure(**failure) for failure in run.failures],
            error=run.error,
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=ended,
            duration_seconds=duration,
        )

    @property
    def summary(self) -> str:
        """``12 added, 3 updated, 980 unchanged, 5 removed, 0 failed`` (and the error, if any)."""
        counts = f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged, {self.removed} removed"
        failed = f", {self.failed} failed" + (f", {self.skipped} unsupported skipped" if self.skipped else "")
        return counts + failed + (f". {self.error}" if self.error else "")


class SourceOut(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    collection: str
    kind: str = Field(description="folder or urls")
    folder: str
    recursive: bool
    include: list[str]
    exclude: list[str]
    urls: list[str]
    sitemap_url: str
    interval_minutes: int | None = Field(description="Synced on this schedule; null: on demand only")
    next_sync_at: datetime | None
    documents: int = Field(description="Documents the source brought into its collection")
    last_run: SyncRunOut | None
    created_at: datetime

    @classmethod
    def of(cls, source: Source) -> "SourceOut":
        last = source.runs.select_related("source__collection").first()
        return cls(
            name=source.name,
            collection=source.collection.name,
            kind=source.kind,
            folder=source.folder,
            recursive=source.recursive,
            include=source.include,
            exclude=source.exclude,
            urls=source.urls,
            sitemap_url=source.sitemap_url,
            interval_minutes=source.interval_minutes,
            next_sync_at=source.next_sync_at,
            documents=source.items.count(),
            last_run=SyncRunOut.of(last) if last else None,
            created_at=source.created_at,
        )


def source_get(*, name: str) -> Source:
    refuse_nul(name)
    try:
        return Source.objects.select_related("collection").get(name=name)
    except Source.DoesNotExist:
        raise KBError(ErrorCode.NOT_FOUND, f"Source not found: {name}") from None


def source_list() -> QuerySet[Source]:
    return Source.objects.select_related("collection").order_by("name")


def sync_run_get(*, run_id: str) -> SyncRun:
    """The run of ``run_id``; a malformed id is not found either, at every door."""
    if not ULID_FORM.fullmatch(run_id):
        refuse_nul(run_id)
        raise KBError(ErrorCode.NOT_FOUND, "Sync run not found: a sync run id is 26 letters and digits")
    try:
        return SyncRun.objects.select_related("source__collection").get(pk=run_id)
    except SyncRun.DoesNotExist:
        raise KBError(ErrorCode.NOT_FOUND, f"Sync run not found: {run_id}") from None


def sync_runs(*, source: Source, limit: int = RUNS_SHOWN) -> list[SyncRun]:
    return list(source.runs.select_related("source__collection")[:limit])


def sync_run_latest(*, source: Source) -> SyncRun:
    """The source's newest run; NOT_FOUND when it never synced."""
    latest = sync_runs(source=source, limit=1)
    if not latest:
        raise KBError(ErrorCode.NOT_FOUND, f"Source {source.name} has not synced yet")
    return latest[0]
