"""Sources that sync (issue 17), through real Celery workers on the file-system broker: runs the
worker executes, what an unchanged file costs (embedding requests counted by a loopback fake of
Ollama), a worker SIGKILLed mid-sync, and the worker's sync step (schedules, lost messages)."""

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import current_app
from django.utils import timezone

from kb.models import (
    Chunk,
    Collection,
    Document,
    DocumentStatus,
    Source,
    SourceItem,
    SyncRun,
    SyncStatus,
    WorkerHeartbeat,
)
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.sources import source_create, sync_execute, sync_start
from kb.work_lanes import bulk_work
from tests.conftest import ChildProcess, start_worker, wait_for
from tests.support.fake_providers import fake_vector
from tests.support.http_server import json_body, serve

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SITEMAP_XMLNS = "http://www.sitemaps.org/schemas/sitemap/0.9"
TICK = 1  # KB_SYNC_TICK_SECONDS of every worker here
LEASE = 5  # KB_SYNC_LEASE_SECONDS (its minimum)


# --- an Ollama that counts what it embeds -----------------------------------------------------------


class CountingOllama:
    """Ollama's /api/embed on loopback (the fake's vectors), remembering every text it embedded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.texts: list[str] = []

    def embed(self, handler, body):  # a tests.support.http_server route
        request = json_body(body)
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        with self._lock:
            self.requests += 1
            self.texts.extend(texts)
        payload = {"model": request["model"], "embeddings": [fake_vector(text) for text in texts]}
        return 200, {"content-type": "application/json"}, json.dumps(payload).encode()

    def embedded(self) -> int:
        with self._lock:
            return len(self.texts)

    def texts_since(self, start: int) -> list[str]:
        with self._lock:
            return self.texts[start:]


@pytest.fixture
def ollama(settings) -> Iterator[tuple[str, CountingOllama]]:
    counter = CountingOllama()
    with serve({"/api/embed": counter.embed}) as base:
        settings.OLLAMA_HOST = base  # this process checks the model when a collection is made
        yield base, counter


@pytest.fixture(autouse=True)
def empty_broker() -> Iterator[None]:
    """No message left by another test (or left behind by a killed worker) reaches these workers,
    and none of theirs reaches the next test's."""
    current_app.control.purge()
    yield
    current_app.control.purge()


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., ChildProcess]]:
    """Start real workers (``workers(env, name=...)``); every one is gone before the database is emptied."""
    started: list[ChildProcess] = []

    def start(env: dict[str, str], *, name: str = "worker") -> ChildProcess:
        worker = start_worker(tmp_path, extra_env=env, name=name)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        # Killed, not asked to stop: a warm shutdown takes 4-14 s here and is not what these tests are about.
        worker.kill(signal.SIGKILL)
        worker.stop()


def worker_env(root: Path, ollama_base: str, **extra: str) -> dict[str, str]:
    return {
        "KB_FILE_ROOTS": str(root),
        "OLLAMA_HOST": ollama_base,
        "KB_SYNC_TICK_SECONDS": str(TICK),
        "KB_SYNC_LEASE_SECONDS": str(LEASE),
        **extra,
    }


def remote_collection(name: str, **options: int) -> Collection:
    """A collection embedded by the (counting) fake Ollama, which must answer when it is made."""
    return collection_create(name=name, embedding_provider="ollama", embedding_model="fake-embed", **options)


# --- files and what the collection holds -----------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def uri(path: Path) -> str:
    return path.resolve().as_uri()


def uris_of(collection: Collection) -> set[str]:
    return set(Document.objects.filter(collection=collection).values_list("source_uri", flat=True))


def item_uris(source: Source) -> set[str]:
    return set(SourceItem.objects.filter(source=source).values_list("uri", flat=True))


def note(topic: str, sections: int = 3, version: str = "") -> str:
    """A Markdown note whose sections are chunks of their own (with chunk_max_tokens=40)."""
    parts = [f"# {topic}\n"]
    for n in range(sections):
        parts.append(
            f"## {topic} part {n}\n\n"
            f"The {topic} survey, part {n}{version}, measured drift number {n} along the {topic} ridge "
            f"and logged it in the {topic} notebook for later review.\n"
        )
    return "\n".join(parts)


# --- runs ---------------------------------------------------------------------------------------------


def run_row(run_id: str) -> SyncRun:
    return SyncRun.objects.get(pk=run_id)


def wait_until_done(run_id: str, worker: ChildProcess, timeout: float = 60) -> SyncRun:
    """The run once it succeeded (fails the test with the worker's log if it failed or hangs)."""
    try:
        wait_for(
            lambda: run_row(run_id).status in (SyncStatus.SUCCEEDED, SyncStatus.FAILED),
            timeout=timeout,
            interval=0.1,
            what=f"sync run {run_id} to finish",
        )
    except AssertionError as exc:
        row = run_row(run_id)
        raise AssertionError(f"{exc}: {row.status}, {row.processed}/{row.total}\n{worker.log()[-4000:]}") from None
    run = run_row(run_id)
    assert run.status == SyncStatus.SUCCEEDED, f"{run.error!r} {run.failures}\n{worker.log()[-4000:]}"
    assert run.finished_at is not None and run.lease_expires_at is None and run.worker
    return run


def counts(run: SyncRun) -> dict[str, int]:
    names = ("total", "processed", "added", "updated", "unchanged", "removed", "skipped", "failed")
    return {name: getattr(run, name) for name in names}


def sync_through_worker(source: Source, worker: ChildProcess) -> SyncRun:
    started = sync_start(source=source)
    assert started.started, f"a run was already active: {started.run}"
    return wait_until_done(started.run.pk, worker)


# --- 1. a folder followed through the worker ------------------------------------------------------


def test_a_folder_syncs_through_the_worker_adding_updating_renaming_and_removing(tmp_path, settings, ollama, workers):
    base, _counter = ollama
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    folder = tmp_path / "notes"
    files = {
        "alpha": write(folder / "alpha.md", note("alpha")),
        "beta": write(folder / "beta.txt", "Beta is a plain text note about beekeeping.\n"),
        "gamma": write(folder / "deep" / "gamma.md", note("gamma")),
        "delta": write(folder / "delta.md", note("delta")),
        "epsilon": write(folder / "epsilon.txt", "Epsilon stays exactly as it is.\n"),
    }
    collection = remote_collection("synced")
    # A document the source did not bring: no sync of it ever removes it.
    document_create_from_text(collection=collection, source_uri="note://by-hand", text="Written by hand.")
    source = source_create(collection=collection, name="notes", folder=str(folder))
    worker = workers(worker_env(tmp_path, base))

    first = sync_through_worker(source, worker)
    assert counts(first) == {
        "total": 5, "processed": 5, "added": 5, "updated": 0, "unchanged": 0, "removed": 0, "skipped": 0, "failed": 0,
    }  # fmt: skip
    assert first.trigger == "manual" and first.error == "" and first.failures == []
    expected = {uri(path) for path in files.values()}
    assert uris_of(collection) == expected | {"note://by-hand"}
    assert item_uris(source) == expected

    write(files["alpha"], note("alpha", version=" (revised)"))  # changed
    added = write(folder / "deep" / "zeta.md", note("zeta"))  # new
    files["beta"].unlink()  # deleted
    renamed = files["delta"].rename(folder / "deep" / "delta-renamed.md")  # renamed: a new URI, the old one goes

    second = sync_through_worker(source, worker)
    assert counts(second) == {
        "total": 5, "processed": 5, "added": 2, "updated": 1, "unchanged": 2, "removed": 2, "skipped": 0, "failed": 0,
    }  # fmt: skip
    expected = {uri(files["alpha"]), uri(files["gamma"]), uri(files["epsilon"]), uri(added), uri(renamed)}
    assert uris_of(collection) == expected | {"note://by-hand"}
    assert item_uris(source) == expected
    alpha = Document.objects.get(collection=collection, source_uri=uri(files["alpha"]))
    assert "(revised)" in alpha.raw_content
    assert Document.objects.filter(collection=collection).count() == 6  # one document per URI, no duplicates
    assert list(SyncRun.objects.filter(source=source).values_list("pk", flat=True)) == [second.pk, first.pk]


# --- 2. an unchanged file costs no embedding -----------------------------------------------------


def all_ready(collection: Collection, expected: int) -> bool:
    documents = Document.objects.filter(collection=collection)
    return documents.count() == expected and not documents.exclude(status=DocumentStatus.READY).exists()


def test_unchanged_files_cost_no_embedding_and_a_changed_file_only_its_changed_chunks(
    tmp_path, settings, ollama, workers
):
    base, counter = ollama
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    folder = tmp_path / "notes"
    topics = ["harbour", "glacier", "orchard", "lighthouse"]
    paths = {topic: write(folder / f"{topic}.md", note(topic, sections=4)) for topic in topics}
    collection = remote_collection("counted", chunk_max_tokens=40, chunk_min_tokens=0)
    source = source_create(collection=collection, name="counted", folder=str(folder))
    worker = workers(worker_env(tmp_path, base))
    before_first = counter.embedded()  # the model was checked when the collection was made

    first = sync_through_worker(source, worker)
    assert (first.added, first.unchanged) == (4, 0)
    wait_for(lambda: all_ready(collection, 4), timeout=60, what="every document to be embedded")
    chunks = Chunk.objects.filter(collection=collection).count()
    assert chunks >= 4 * 4  # every section is a chunk of its own at least
    first_embedded = counter.embedded() - before_first
    assert first_embedded == chunks, "each chunk is embedded exactly once"

    before_second, requests = counter.embedded(), counter.requests
    second = sync_through_worker(source, worker)
    assert (second.added, second.updated, second.unchanged, second.removed) == (0, 0, 4, 0)
    time.sleep(2)  # time for the worker to embed anything it was (wrongly) given
    assert counter.embedded() == before_second, counter.texts_since(before_second)
    assert counter.requests == requests
    assert all_ready(collection, 4)

    changed = Document.objects.get(collection=collection, source_uri=uri(paths["glacier"]))
    old_hashes = set(changed.chunks.values_list("content_hash", flat=True))
    write(paths["glacier"], note("glacier", sections=4).replace("part 2, measured", "part 2 (redone), measured"))
    before_third = counter.embedded()
    third = sync_through_worker(source, worker)
    assert (third.added, third.updated, third.unchanged, third.removed) == (0, 1, 3, 0)
    wait_for(lambda: all_ready(collection, 4), timeout=60, what="the changed document to be embedded")
    new_chunks = dict(changed.chunks.values_list("content_hash", "content"))
    new_texts = {content for content_hash, content in new_chunks.items() if content_hash not in old_hashes}
    embedded = counter.texts_since(before_third)
    assert 0 < len(embedded) < first_embedded
    assert sorted(embedded) == sorted(new_texts), "only the changed chunks of the changed file are embedded"
    assert all("(redone)" in text for text in embedded)
    changed.refresh_from_db()
    assert changed.embedded_count == changed.chunk_count == len(new_chunks)


# --- 3. a worker SIGKILLed mid-sync ---------------------------------------------------------------

FILES = 160


def long_note(n: int, version: str = "") -> str:
    """About 3 KB of text, different in every file."""
    return "\n\n".join(
        f"Log {n}, entry {k}{version}: station {n * 7 + k} recorded pressure {n + k} hPa and wind {k} knots "
        f"from bearing {(n * 13 + k) % 360}; the crew of shift {n % 5} signed it off." * 2
        for k in range(12)
    )


def test_a_worker_killed_mid_sync_removes_nothing_and_the_next_run_completes(
    tmp_path, settings, ollama, workers, monkeypatch
):
    base, _counter = ollama
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    settings.KB_SYNC_LEASE_SECONDS = LEASE
    folder = tmp_path / "logs"
    paths = [write(folder / f"log-{n:03d}.txt", long_note(n)) for n in range(FILES)]
    collection = remote_collection("logs")
    source = source_create(collection=collection, name="logs", folder=str(folder))

    # The first sync runs in this process: its documents are not the point, their embedding is not queued.
    with monkeypatch.context() as patched:
        patched.setattr("kb.services.sources.enqueue_sync", lambda run_id: None)
        patched.setattr("kb.services.documents.enqueue_embedding", lambda document_id, interactive: None)
        clock = time.monotonic()
        first = sync_execute(run_id=sync_start(source=source).run.pk, worker="test")
        print(f"\nin-process first sync of {FILES} files: {time.monotonic() - clock:.1f}s")
    assert first is not None and (first.status, first.added) == (SyncStatus.SUCCEEDED, FILES), first.error
    assert uris_of(collection) == {uri(path) for path in paths}

    deleted, kept = paths[::16], [path for n, path in enumerate(paths) if n % 16]
    for path in deleted:
        path.unlink()
    for n, path in enumerate(paths):  # every file left is changed: the run has seconds of work
        if path.exists():
            write(path, long_note(n, version=" (second reading)"))

    env = worker_env(tmp_path, base)
    doomed = workers(env, name="doomed")
    run_id = sync_start(source=source).run.pk
    wait_for(
        lambda: (row := run_row(run_id)).status == SyncStatus.RUNNING and 0 < row.processed < row.total,
        timeout=60,
        interval=0.02,
        what="the sync to be under way",
    )
    doomed.kill(signal.SIGKILL)  # the worker and its pool child, mid-run
    killed_at = time.monotonic()
    doomed.process.wait()
    killed = run_row(run_id)
    print(f"killed at {killed.processed}/{killed.total} files")
    assert killed.status == SyncStatus.RUNNING and killed.processed < killed.total == len(kept)
    assert uris_of(collection) == {uri(path) for path in paths}, "a run that did not finish removed documents"
    assert item_uris(source) == {uri(path) for path in paths}

    successor = workers(env, name="successor")
    try:
        wait_for(lambda: run_row(run_id).status != SyncStatus.RUNNING, timeout=LEASE + TICK + 30, interval=0.05)
    except AssertionError as exc:
        row = run_row(run_id)
        state = f"{row.status} lease {row.lease_expires_at} now {timezone.now()} worker {row.worker}"
        raise AssertionError(f"{exc}: the dead run was not given up ({state})\n{successor.log()[-6000:]}") from None
    given_up_after = time.monotonic() - killed_at
    dead = run_row(run_id)
    after_lease = (dead.finished_at - killed.lease_expires_at).total_seconds()
    print(
        f"SIGKILL -> dead run marked failed: {given_up_after:.1f}s "
        f"({after_lease:.1f}s after its lease ran out; lease {LEASE}s, tick {TICK}s)"
    )
    assert dead.status == SyncStatus.FAILED and dead.lease_expires_at is None
    assert "stopped before it finished" in dead.error and "nothing was removed" in dead.error
    # Not given up before its lease ran out (a live worker renews it), and soon after (the
    # successor's start, under load, is most of the slack).
    assert 0 <= after_lease < TICK + 15
    assert uris_of(collection) == {uri(path) for path in paths}

    started = sync_start(source=source)
    assert started.started and started.run.pk != run_id
    clock = time.monotonic()
    last = wait_until_done(started.run.pk, successor, timeout=90)
    print(f"the next run through the worker: {time.monotonic() - clock:.1f}s")
    assert (last.total, last.processed, last.removed, last.failed) == (len(kept), len(kept), len(deleted), 0)
    assert last.updated + last.unchanged == len(kept) and last.added == 0
    assert last.worker.startswith("successor-")
    assert uris_of(collection) == {uri(path) for path in kept}
    assert item_uris(source) == {uri(path) for path in kept}


# --- 4. the worker's step starts the sources that are due -------------------------------------------


def test_a_scheduled_source_is_synced_by_the_worker_s_step_once_per_interval(tmp_path, settings, ollama, workers):
    base, _counter = ollama
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    folder = tmp_path / "scheduled"
    paths = [write(folder / f"{name}.md", note(name)) for name in ("tide", "moon")]
    collection = remote_collection("scheduled")
    source = source_create(collection=collection, name="every-minute", folder=str(folder), interval_minutes=1)
    assert source.next_sync_at is not None and source.next_sync_at <= source.created_at  # due at once
    on_demand = source_create(collection=remote_collection("manual"), name="on-demand", folder=str(folder))
    assert on_demand.next_sync_at is None
    worker = workers(worker_env(tmp_path, base))

    wait_for(lambda: source.runs.exists(), timeout=30, what="the worker's step to start the scheduled sync")
    run = wait_until_done(source.runs.get().pk, worker)
    assert run.trigger == "schedule" and (run.added, run.total) == (2, 2)
    assert uris_of(collection) == {uri(path) for path in paths}
    source.refresh_from_db()
    ahead = (source.next_sync_at - run.created_at).total_seconds()
    assert 59 <= ahead <= 61, f"next_sync_at is {ahead:.1f}s after the run"

    time.sleep(3 * TICK + 1)  # several more steps of the worker: the source is not due again for a minute
    assert list(source.runs.values_list("pk", flat=True)) == [run.pk]
    assert not on_demand.runs.exists(), "a source without interval_minutes syncs only on demand"


# --- 5. a run whose task message was lost -----------------------------------------------------------


def test_a_queued_run_whose_message_was_lost_is_sent_again_by_the_worker_s_step(tmp_path, settings, ollama, workers):
    base, _counter = ollama
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    folder = tmp_path / "lost"
    paths = [write(folder / f"{name}.txt", f"The {name} note.\n") for name in ("one", "two", "three")]
    collection = remote_collection("lost")
    source = source_create(collection=collection, name="lost", folder=str(folder))
    (folder / "later").mkdir()
    waiting = source_create(collection=collection, name="in-flight", folder=str(folder / "later"))
    worker = workers(worker_env(tmp_path, base))
    wait_for(
        lambda: WorkerHeartbeat.objects.filter(hostname__startswith="worker-").exists(),
        timeout=60,
        what="the worker to be up (its step already ran once)",
    )

    # Queued, and its message never reached the broker: its resend deadline has passed.
    lost = SyncRun.objects.create(source=source, lease_expires_at=timezone.now() - timedelta(seconds=1))
    # Queued too, with a message that may still be on its way: not sent again before its deadline.
    in_flight = SyncRun.objects.create(source=waiting, lease_expires_at=timezone.now() + timedelta(hours=1))

    clock = time.monotonic()
    run = wait_until_done(lost.pk, worker, timeout=30)
    print(f"\nlost message -> run done: {time.monotonic() - clock:.1f}s")
    assert run.trigger == "manual" and (run.total, run.added, run.failed) == (3, 3, 0)
    assert uris_of(collection) == {uri(path) for path in paths}
    time.sleep(2 * TICK + 0.5)
    assert run_row(in_flight.pk).status == SyncStatus.QUEUED


# --- 6. a live worker's run is not taken for dead -----------------------------------------------------


def test_a_live_worker_s_run_is_not_given_up_while_its_sitemap_scan_outlasts_the_lease(
    tmp_path, settings, ollama, workers
):
    """The lease is renewed only between items: a sitemap index whose sitemaps are each fetched
    within KB_FETCH_TIMEOUT_SECONDS, but together take longer than KB_SYNC_LEASE_SECONDS, must not
    make the worker's own sync step give the run up (with defaults: 4 sitemaps of 16 s, lease 60 s)."""
    base, _counter = ollama
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    sitemaps, delay = 3, 2.5  # 7.5 s of scan, more than the 5 s lease (and the step's 1 s tick)

    def site(handler) -> str:
        return f"http://{handler.headers['host']}"

    def index(handler, body):
        entries = "".join(f"<sitemap><loc>{site(handler)}/sitemap-{n}.xml</loc></sitemap>" for n in range(sitemaps))
        xml = f'<?xml version="1.0"?><sitemapindex xmlns="{SITEMAP_XMLNS}">{entries}</sitemapindex>'
        return 200, {"content-type": "application/xml"}, xml.encode()

    def slow_sitemap(n: int):
        def route(handler, body):
            time.sleep(delay)  # a busy server, well within the fetch timeout
            xml = f'<urlset xmlns="{SITEMAP_XMLNS}"><url><loc>{site(handler)}/page-{n}</loc></url></urlset>'
            return 200, {"content-type": "application/xml"}, xml.encode()

        return route

    def page(n: int):
        return lambda handler, body: (200, {"content-type": "text/plain"}, f"Page {n} of the slow site.".encode())

    routes = {"/sitemap.xml": index}
    routes.update({f"/sitemap-{n}.xml": slow_sitemap(n) for n in range(sitemaps)})
    routes.update({f"/page-{n}": page(n) for n in range(sitemaps)})
    with serve(routes) as site_base:
        collection = remote_collection("site")
        source = source_create(collection=collection, name="site", sitemap_url=f"{site_base}/sitemap.xml")
        worker = workers(worker_env(tmp_path, base, KB_FETCH_ALLOWED_PRIVATE_HOSTS="127.0.0.1"))
        run_id = sync_start(source=source).run.pk
        wait_for(lambda: run_row(run_id).status != SyncStatus.QUEUED, timeout=30, what="the run to start")
        wait_for(
            lambda: run_row(run_id).status in (SyncStatus.SUCCEEDED, SyncStatus.FAILED),
            timeout=sitemaps * delay + 30,
            what="the run to finish",
        )
        run = run_row(run_id)
        assert worker.alive()
        assert run.status == SyncStatus.SUCCEEDED, (
            f"the run of a live worker was given up: {run.status}, {run.error!r}, {run.processed}/{run.total}"
        )
        assert run.added == sitemaps
        assert uris_of(collection) == {f"{site_base}/page-{n}" for n in range(sitemaps)}


# --- a sync does not wait behind bulk embedding --------------------------------------------------


def test_a_sync_starts_while_thousands_of_documents_wait_for_embedding(tmp_path, workers, settings):
    """A sync run takes its own queue: behind the 200 embedding messages of a bulk import (each
    slowed to 50 ms by the fake provider), a sync asked for later ends while most still wait. In
    the one queue they shared, a sync after a 10,000-file one had waited about 45 minutes."""
    counter = CountingOllama()

    def slow_embed(handler, body):
        time.sleep(0.05)
        return counter.embed(handler, body)

    with serve({"/api/embed": slow_embed}) as base:
        settings.OLLAMA_HOST = base
        bulk = remote_collection("bulk")
        with bulk_work():
            for n in range(200):
                document_create_from_text(collection=bulk, source_uri=f"note://{n}", text=f"Bulk note {n}.")
        folder = tmp_path / "roots" / "docs"
        write(folder / "a.md", "# A\n\nThe file a sync brings.")
        settings.KB_FILE_ROOTS = [tmp_path / "roots"]
        source = source_create(collection=remote_collection("synced"), name="docs", folder=str(folder))
        run_id = sync_start(source=source).run.pk
        workers(worker_env(tmp_path / "roots", base))
        wait_for(
            lambda: SyncRun.objects.get(pk=run_id).status == SyncStatus.SUCCEEDED,
            timeout=120,
            what="the sync run to end",
        )
        waiting = Document.objects.filter(collection=bulk, status=DocumentStatus.PENDING).count()
    assert waiting >= 100, f"only {waiting} of 200 bulk documents were still waiting when the sync ended"
