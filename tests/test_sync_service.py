"""Sources that sync (issue 17) at the service layer: ``sync_start`` then ``sync_execute`` in this
process, as the worker's task runs them; folders under tmp_path, URLs on a loopback server.

Every sync is checked by the exact set of documents its collection holds afterwards and by the
run's counts; the real worker is tested in test_sync_worker."""

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from kb.errors import ErrorCode, KBError
from kb.models import Chunk, Collection, Document, Source, SourceItem, SyncRun, SyncStatus
from kb.selectors.sources import SyncRunOut
from kb.services.collections import collection_create, collection_delete
from kb.services.documents import document_create_from_text, document_delete
from kb.services.ingest import document_ingest
from kb.services.sources import (
    MAX_INTERVAL_MINUTES,
    source_create,
    source_delete,
    source_update,
    sync_execute,
    sync_start,
    sync_tick,
)
from tests.support.http_server import serve

COUNTS = ("added", "updated", "unchanged", "removed", "failed", "skipped", "total")


# --- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def roots(settings, tmp_path) -> Path:
    """tmp_path is the one folder sources may follow."""
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    return tmp_path


@pytest.fixture
def collection(db) -> Collection:
    return collection_create(name="synced")


def sync(source: Source) -> SyncRun:
    """One whole sync, as the worker's task would run it: queued, claimed, executed."""
    start = sync_start(source=source)
    assert start.started, f"a run of {source.name} was already active"
    assert start.run.status == SyncStatus.QUEUED
    run = sync_execute(run_id=start.run.pk, worker="test-worker")
    assert run is not None
    assert run.processed == run.total
    return run


def counts(run: SyncRun) -> dict[str, int]:
    return {name: getattr(run, name) for name in COUNTS}


def expected(**given: int) -> dict[str, int]:
    return {name: given.get(name, 0) for name in COUNTS}


def uris(collection: Collection) -> set[str]:
    return set(Document.objects.filter(collection=collection).values_list("source_uri", flat=True))


def item_uris(source: Source) -> set[str]:
    return set(SourceItem.objects.filter(source=source).values_list("uri", flat=True))


def file_uris(folder: Path, *names: str) -> set[str]:
    return {(folder / name).resolve().as_uri() for name in names}


def write(folder: Path, *names: str, version: str = "first") -> None:
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {name}\n\nThe {version} version of {name}, about wings and lift.\n")


def chunk_ids(collection: Collection) -> dict[str, list[int]]:
    return {
        document.source_uri: sorted(document.chunks.values_list("id", flat=True))
        for document in Document.objects.filter(collection=collection)
    }


# --- a loopback site whose pages carry ETags -----------------------------------------------------


class Site:
    """Pages behind tests.support.http_server: 200 with an ETag, or 304 when If-None-Match matches
    it. Remembers every request, the If-None-Match headers it saw and the full (200) answers."""

    def __init__(self) -> None:
        self.routes: dict[str, Callable] = {}
        self.base = ""
        self._lock = threading.Lock()
        self.pages: dict[str, tuple[int, str, str]] = {}  # path -> (status, body, etag)
        self.requested: list[str] = []  # paths with their query strings
        self.if_none_match: list[tuple[str, str]] = []
        self.full: Counter[str] = Counter()
        self.not_modified: Counter[str] = Counter()
        self.holds: dict[str, tuple[threading.Event, threading.Event]] = {}

    def url(self, path: str) -> str:
        return self.base + path

    def page(self, path: str, body: str, etag: str = "", status: int = 200) -> str:
        self.pages[path] = (status, body, etag or f'"{abs(hash(body))}"')
        self.routes[path] = self._answer
        return self.url(path)

    def sitemap(self, path: str, page_paths: list[str]) -> str:
        locations = "".join(f"<url><loc>{self.url(page)}</loc></url>" for page in page_paths)
        body = f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locations}</urlset>'
        return self.raw(path, body, content_type="application/xml")

    def raw(self, path: str, body: str, content_type: str = "application/xml", status: int = 200) -> str:
        def answer(handler, _request):
            self._record(handler)
            return status, {"content-type": content_type}, body.encode()

        self.routes[path] = answer
        return self.url(path)

    def gone(self, path: str) -> None:
        self.routes.pop(path)  # the server answers 404

    def hold(self, path: str) -> tuple[threading.Event, threading.Event]:
        """The next request for ``path`` sets the first event, then waits for the second."""
        entered, release = threading.Event(), threading.Event()
        self.holds[path] = (entered, release)
        return entered, release

    def _record(self, handler) -> None:
        with self._lock:
            self.requested.append(handler.path)

    def _answer(self, handler, _request):
        self._record(handler)
        path = handler.path.split("?")[0]
        if path in self.holds:
            entered, release = self.holds.pop(path)
            entered.set()
            release.wait(10)
        status, body, etag = self.pages[path]
        sent = handler.headers.get("If-None-Match")
        with self._lock:
            if sent:
                self.if_none_match.append((path, sent))
            if status != 200:
                return status, {"content-type": "text/plain"}, f"error {status}".encode()
            if sent == etag:
                self.not_modified[path] += 1
                return 304, {"etag": etag}, b""
            self.full[path] += 1
        return 200, {"content-type": "text/plain", "etag": etag}, body.encode()


@pytest.fixture
def site(settings) -> Iterator[Site]:
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    pages = Site()
    with serve(pages.routes) as base:
        pages.base = base
        yield pages


# --- 1. a folder followed through changes ----------------------------------------------------------


def test_a_folder_sync_adds_updates_and_removes_to_match_the_folder(roots, collection):
    folder = roots / "docs"
    write(folder, "guide.md", "notes.txt", "sub/deep.md", "sub/inner/more.txt")
    (folder / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))  # not a supported type
    source = source_create(collection=collection, name="docs", folder=str(folder))

    first = sync(source)
    assert first.status == SyncStatus.SUCCEEDED and first.error == ""
    assert counts(first) == expected(added=4, skipped=1, total=5)
    followed = file_uris(folder, "guide.md", "notes.txt", "sub/deep.md", "sub/inner/more.txt")
    assert uris(collection) == followed
    assert item_uris(source) == followed

    write(folder, "notes.txt", version="second")  # changed
    write(folder, "sub/new.md")  # added
    (folder / "sub/deep.md").unlink()  # deleted
    (folder / "guide.md").rename(folder / "handbook.md")  # renamed: the old one removed, the new one added

    second = sync(source)
    assert second.status == SyncStatus.SUCCEEDED and second.error == ""
    assert counts(second) == expected(added=2, updated=1, unchanged=1, removed=2, skipped=1, total=5)
    followed = file_uris(folder, "handbook.md", "notes.txt", "sub/new.md", "sub/inner/more.txt")
    assert uris(collection) == followed
    assert item_uris(source) == followed
    notes = Document.objects.get(source_uri=(folder / "notes.txt").resolve().as_uri())
    assert "second version" in notes.raw_content

    third = sync(source)
    assert counts(third) == expected(unchanged=4, skipped=1, total=5)
    assert uris(collection) == followed


# --- 2. an unchanged file costs a read and a hash, no parse ----------------------------------------


def test_an_unchanged_file_is_not_parsed_again(roots, collection, settings):
    folder = roots / "docs"
    write(folder, "a.md", "b.md", "sub/c.txt")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=3, total=3)
    chunks_before = chunk_ids(collection)
    stamps_before = dict(Document.objects.values_list("source_uri", "updated_at"))
    assert all(chunks_before.values())

    # Parsing any of these files now fails (their text is over the limit): a sync that parsed
    # them again would count them failed; one that compares hashes first finds them unchanged.
    settings.KB_MAX_TEXT_CHARS = 10
    second = sync(source)
    assert counts(second) == expected(unchanged=3, total=3)
    assert second.failures == []
    assert chunk_ids(collection) == chunks_before
    assert dict(Document.objects.values_list("source_uri", "updated_at")) == stamps_before

    # The limit is live: a file that did change is parsed, fails, and keeps its old document.
    write(folder, "a.md", version="second")
    third = sync(source)
    assert counts(third) == expected(unchanged=2, failed=1, total=3)
    [failure] = third.failures
    assert failure["uri"] == (folder / "a.md").resolve().as_uri()
    assert failure["code"] == "LOAD_FAILED" and "KB_MAX_TEXT_CHARS" in failure["message"]
    assert uris(collection) == file_uris(folder, "a.md", "b.md", "sub/c.txt")
    assert chunk_ids(collection) == chunks_before


# --- 3. globs and recursion --------------------------------------------------------------------------


def test_include_and_exclude_globs_and_recursive_false_choose_the_files(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.txt", "drafts/c.md", "sub/d.md", "sub/e.txt", "sub/drafts/f.md")
    globbed = source_create(
        collection=collection, name="globbed", folder=str(folder), include=["*.md"], exclude=["drafts/*"]
    )
    assert counts(sync(globbed)) == expected(added=3, total=3)
    assert uris(collection) == file_uris(folder, "a.md", "sub/d.md", "sub/drafts/f.md")

    flat_collection = collection_create(name="flat")
    flat = source_create(collection=flat_collection, name="flat", folder=str(folder), recursive=False)
    assert counts(sync(flat)) == expected(added=2, total=2)
    assert uris(flat_collection) == file_uris(folder, "a.md", "b.txt")


@pytest.mark.parametrize(
    ("pattern", "selected"),
    [
        ("**/*.md", {"a.md", "sub/d.md", "sub/drafts/f.md", "drafts/c.md"}),  # the top's too, as in .gitignore
        ("sub/**/*.md", {"sub/d.md", "sub/drafts/f.md"}),
        ("**/drafts/*", {"drafts/c.md", "sub/drafts/f.md"}),
        ("*.md", {"a.md", "sub/d.md", "sub/drafts/f.md", "drafts/c.md"}),
        ("drafts/*", {"drafts/c.md"}),
    ],
)
def test_a_glob_s_double_star_also_stands_for_no_folder(pattern, selected):
    from kb.services.sources import _selected

    paths = ["a.md", "b.txt", "drafts/c.md", "sub/d.md", "sub/e.txt", "sub/drafts/f.md"]
    assert {path for path in paths if _selected(Path(path), [pattern], [])} == selected
    assert {path for path in paths if not _selected(Path(path), [], [pattern])} == selected


def test_narrowing_a_source_removes_what_it_no_longer_covers_at_the_next_sync(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.txt", "drafts/c.md", "sub/d.md", "sub/e.txt")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=5, total=5)

    source = source_update(source=source, include=["*.md"], exclude=["drafts/*"])
    assert uris(collection) == file_uris(folder, "a.md", "b.txt", "drafts/c.md", "sub/d.md", "sub/e.txt")
    narrowed = sync(source)
    assert counts(narrowed) == expected(unchanged=2, removed=3, total=2)
    assert uris(collection) == file_uris(folder, "a.md", "sub/d.md")
    assert item_uris(source) == file_uris(folder, "a.md", "sub/d.md")

    source = source_update(source=source, recursive=False)
    assert counts(sync(source)) == expected(unchanged=1, removed=1, total=1)
    assert uris(collection) == file_uris(folder, "a.md")

    source = source_update(source=source, include=[], exclude=[], recursive=True)  # widened again
    assert counts(sync(source)) == expected(unchanged=1, added=4, total=5)
    assert uris(collection) == file_uris(folder, "a.md", "b.txt", "drafts/c.md", "sub/d.md", "sub/e.txt")


# --- 4. a scan that cannot complete removes nothing ---------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "renamed", "outside the roots"])
def test_a_folder_that_cannot_be_scanned_removes_nothing(roots, collection, settings, how):
    folder = roots / "docs"
    write(folder, "a.md", "sub/b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=2, total=2)
    held = uris(collection)
    if how == "deleted":
        shutil.rmtree(folder)
    elif how == "renamed":
        folder.rename(roots / "docs-moved")
    else:
        (roots / "elsewhere").mkdir()
        settings.KB_FILE_ROOTS = [str(roots / "elsewhere")]

    run = sync(source)
    assert run.status == SyncStatus.FAILED
    assert run.error
    assert counts(run) == expected()
    assert uris(collection) == held
    assert item_uris(source) == held
    assert SyncRunOut.of(run).done


def test_the_error_of_a_folder_that_is_gone_says_nothing_was_removed(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync(source)
    shutil.rmtree(folder)
    run = sync(source)
    assert run.status == SyncStatus.FAILED
    assert "nothing was removed" in run.error, run.error


def _path_too_long_below(folder: Path) -> Path:
    """Folders nested below ``folder`` until the whole path is longer than the system opens by name
    (PATH_MAX, 4,096 bytes on Linux); made one by one relative to the last, which the system allows."""
    path, descriptor = folder, os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while len(os.fsencode(path)) <= 4096:
            os.mkdir("d" * 250, dir_fd=descriptor)
            inner = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=descriptor)
            os.close(descriptor)
            descriptor, path = inner, path / ("d" * 250)
    finally:
        os.close(descriptor)
    return path


def test_a_path_too_long_to_list_keeps_no_other_removal_from_happening(roots, collection):
    # It had: every sync of the source failed with "nothing was removed", for as long as it was there.
    folder = roots / "docs"
    write(folder, "a.md", "b.md", "sub/c.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=3, total=3)
    too_long = _path_too_long_below(folder / "sub")
    (folder / "b.md").unlink()
    run = sync(source)
    assert run.status == SyncStatus.FAILED
    assert run.error == f"Cannot list {too_long}: File name too long; nothing inside it was removed"
    assert run.removed == 1
    assert uris(collection) == file_uris(folder, "a.md", "sub/c.md")


def test_a_subfolder_that_cannot_be_listed_keeps_its_own_documents(roots, collection, monkeypatch):
    folder = roots / "docs"
    write(folder, "a.md", "b.md", "locked/c.md", "locked/deeper/d.md", "locked-not/e.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=5, total=5)
    (folder / "b.md").unlink()
    (folder / "locked-not" / "e.md").unlink()
    locked, scandir = (folder / "locked").resolve(), os.scandir

    def refused(path: str) -> Iterator[os.DirEntry]:
        # A folder whose permissions were taken away: the tests run as root, whom chmod does not stop.
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr("kb.ingestion.sources.os.scandir", refused)
    run = sync(source)
    assert run.error == f"Cannot list {locked}: Permission denied; nothing inside it was removed"
    assert uris(collection) == file_uris(folder, "a.md", "locked/c.md", "locked/deeper/d.md")
    assert run.removed == 2

    monkeypatch.setattr("kb.ingestion.sources.os.scandir", scandir)
    (folder / "locked" / "c.md").unlink()
    run = sync(source)
    assert run.status == SyncStatus.SUCCEEDED and run.removed == 1
    assert uris(collection) == file_uris(folder, "a.md", "locked/deeper/d.md")


def test_a_url_source_whose_sitemap_cannot_be_fetched_removes_nothing(collection, site):
    site.page("/p1", "Page one")
    site.page("/p2", "Page two")
    listed = site.url("/p3")
    site.page("/p3", "Page three")
    sitemap = site.sitemap("/sitemap.xml", ["/p1", "/p2"])
    source = source_create(collection=collection, name="site", urls=[listed], sitemap_url=sitemap)
    assert counts(sync(source)) == expected(added=3, total=3)

    site.gone("/sitemap.xml")  # 404
    run = sync(source)
    assert run.status == SyncStatus.FAILED
    assert "sitemap" in run.error and "404" in run.error and "nothing was removed" in run.error
    assert counts(run) == expected(unchanged=1, total=1)  # the listed URL is still synced
    assert uris(collection) == {site.url("/p1"), site.url("/p2"), listed}


def test_file_names_that_are_not_utf8_are_synced_and_reported(roots, collection):
    # Such a name is a lone surrogate to Python, which Postgres refuses: a FIFO's failure message
    # quoting it broke the run's next write and left it "running"; a readable one failed on its title.
    folder = roots / "docs"
    write(folder, "a.md")
    os.mkfifo(os.fsencode(folder) + b"/pipe\xff.md")
    (Path(os.fsdecode(os.fsencode(folder) + b"/plain\xfe.txt"))).write_text("Some plain text.\n")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    run = sync(source)
    assert run.status == SyncStatus.SUCCEEDED
    assert counts(run) == expected(added=2, failed=1, total=3)
    assert "pipe\ufffd.md is not a regular file" in run.failures[0]["message"]
    titles = set(Document.objects.filter(collection=collection).values_list("title", flat=True))
    assert titles == {"a.md", "plain\ufffd.txt"}


# --- 5. what a source did not bring is not its to remove ---------------------------------------------


def test_documents_ingested_by_other_means_are_never_removed_by_a_sync(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.md", "drafts/secret.md")
    write(roots / "other", "elsewhere.md")
    note = document_create_from_text(collection=collection, source_uri="note://kept", text="A note to keep.")
    document_ingest(collection=collection, uri=str(roots / "other" / "elsewhere.md"), file_roots=[roots])
    # Inside the folder, but excluded from the source: ingested by hand, not by the source.
    document_ingest(collection=collection, uri=str(folder / "drafts" / "secret.md"), file_roots=[roots])
    others = {"note://kept"} | file_uris(roots, "other/elsewhere.md", "docs/drafts/secret.md")
    source = source_create(collection=collection, name="docs", folder=str(folder), exclude=["drafts/*"])

    assert counts(sync(source)) == expected(added=2, total=2)
    assert uris(collection) == others | file_uris(folder, "a.md", "b.md")
    (folder / "a.md").unlink()
    (folder / "b.md").unlink()
    assert counts(sync(source)) == expected(removed=2)
    assert uris(collection) == others
    assert Document.objects.get(pk=note.document.pk).raw_content == "A note to keep."


def test_a_document_that_was_there_before_the_source_found_it_is_updated_but_never_removed(roots, collection, site):
    """An attack helper allowed only to edit sources synced a folder holding a hand-ingested file
    ("unchanged", yet recorded as the source's), then excluded it: the next sync deleted it."""
    folder = roots / "docs"
    write(folder, "a.md", "policy.md")
    document_ingest(collection=collection, uri=str(folder / "policy.md"), file_roots=[roots])
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=1, unchanged=1, total=2)
    assert item_uris(source) == file_uris(folder, "a.md")
    (folder / "policy.md").write_text("# policy.md\n\nRevised.\n")
    assert counts(sync(source)) == expected(updated=1, unchanged=1, total=2)
    source_update(source=source, exclude=["policy.md"])
    assert counts(sync(source)) == expected(unchanged=1, total=1)
    assert uris(collection) == file_uris(folder, "a.md", "policy.md")

    page = site.page("/handbook", "The handbook.")
    document_ingest(collection=collection, uri=page, file_roots=[])
    pages = source_create(collection=collection, name="pages", urls=[page])
    assert counts(sync(pages)) == expected(unchanged=1, total=1)
    source_update(source=pages, urls=[site.page("/other", "Another page.")])
    assert counts(sync(pages)) == expected(added=1, total=1)
    assert page in uris(collection)


def test_a_document_the_source_brought_deleted_and_ingested_again_by_hand_is_no_longer_the_sources(roots, collection):
    """The source's record outlived the document: ingested again by hand under the same URI, it was
    removed by the next sync once the file was gone."""
    folder = roots / "docs"
    write(folder, "keep.md", "other.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=2, total=2)
    kept = str(folder / "keep.md")
    document_delete(doc_id=Document.objects.get(source_uri=Path(kept).as_uri()).pk)
    assert item_uris(source) == file_uris(folder, "other.md")
    document_ingest(collection=collection, uri=kept, file_roots=[roots])
    by_hand = Document.objects.get(source_uri=Path(kept).as_uri())
    (folder / "keep.md").unlink()
    assert counts(sync(source)) == expected(unchanged=1, total=1)
    assert Document.objects.filter(pk=by_hand.pk).exists()

    (folder / "other.md").unlink()  # what the source did bring still goes
    assert counts(sync(source)) == expected(removed=1)
    assert uris(collection) == {by_hand.source_uri}


def test_deleting_documents_a_source_brought_stays_one_statement_and_takes_their_records(roots, collection):
    """The records go with their documents in the database, as chunks do: with Django's cascade,
    every delete of documents had first read each whole row (its text too) into the process."""
    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=2, total=2)
    with CaptureQueriesContext(connection) as queries:
        Document.objects.filter(collection=collection).delete()
    statements = [query["sql"] for query in queries.captured_queries]
    assert not [sql for sql in statements if sql.startswith("SELECT")], statements
    assert not SourceItem.objects.filter(source=source).exists()


def test_links_are_judged_by_where_they_lead(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "drafts/secret.md")
    write(roots / "manual", "policy.md")
    hand = document_ingest(collection=collection, uri=str(roots / "manual" / "policy.md"), file_roots=[roots])
    (folder / "policy.md").symlink_to(roots / "manual" / "policy.md")  # out of the folder
    (folder / "notes.md").symlink_to(folder / "drafts" / "secret.md")  # to an excluded file
    source = source_create(collection=collection, name="docs", folder=str(folder), exclude=["drafts/*"])

    run = sync(source)
    assert counts(run) == expected(added=1, failed=1, total=2)
    assert run.failures[0]["code"] == "INVALID_URI" and "outside the source's folder" in run.failures[0]["message"]
    assert item_uris(source) == file_uris(folder, "a.md")
    (folder / "policy.md").unlink()
    assert counts(sync(source)) == expected(unchanged=1, total=1)
    assert Document.objects.filter(pk=hand.documents[0].pk).exists()  # still on disk, never the source's


@pytest.mark.parametrize("when", ["before it is resolved", "after it is resolved"])
def test_a_file_swapped_for_a_link_out_of_the_folder_during_a_sync_is_not_read(roots, collection, monkeypatch, when):
    """A file was resolved twice, once to check it and once to read it: swapped for a link to a
    file elsewhere under the roots in between, that file became the source's document."""
    from kb.ingestion import sources as loading

    folder = roots / "docs"
    write(folder, "a.md")
    (roots / "elsewhere").mkdir()
    (roots / "elsewhere" / "secret.md").write_text("# Secret\n\nOutside the folder: okapi.\n")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    confine = loading.confine

    def swap() -> None:
        (folder / "a.md").unlink()
        (folder / "a.md").symlink_to(roots / "elsewhere" / "secret.md")

    def swapped_meanwhile(path, roots):
        if when == "before it is resolved":
            swap()
            return confine(path, roots)
        resolved = confine(path, roots)
        swap()
        return resolved

    monkeypatch.setattr(loading, "confine", swapped_meanwhile)
    run = sync(source)
    assert counts(run) == expected(failed=1, total=1)
    assert "okapi" not in " ".join(Chunk.objects.values_list("content", flat=True))
    assert uris(collection) == set()


def test_a_source_changed_while_it_runs_removes_nothing(roots, collection, monkeypatch):
    from kb.services import sources

    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync(source)
    (folder / "b.md").unlink()
    sync_file = sources._sync_file

    def narrowed_meanwhile(source, *args, **kwargs):
        Source.objects.filter(pk=source.pk).update(exclude=["drafts/*"])
        return sync_file(source, *args, **kwargs)

    monkeypatch.setattr(sources, "_sync_file", narrowed_meanwhile)
    run = sync(source)
    assert run.status == SyncStatus.FAILED and run.removed == 0
    assert run.error == "The source was changed while it ran; nothing was removed"
    assert uris(collection) == file_uris(folder, "a.md", "b.md")


@pytest.mark.parametrize("version", ["second", "first"])  # put back changed, or as it was
def test_a_document_written_after_the_scan_is_not_removed_by_it(roots, collection, monkeypatch, version):
    """A caller who put a file back and ingested it while a sync ran was told it was stored; the
    run, whose scan had not found the file, then deleted the document."""
    from kb.services import sources

    folder = roots / "docs"
    write(folder, "a.md", "x.md", "gone.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    assert counts(sync(source)) == expected(added=3, total=3)
    (folder / "x.md").unlink()
    (folder / "gone.md").unlink()
    sync_file = sources._sync_file

    def put_back_meanwhile(*args, **kwargs):
        if not (folder / "x.md").exists():
            write(folder, "x.md", version=version)
            document_ingest(collection=collection, uri=str(folder / "x.md"), file_roots=[roots])
        return sync_file(*args, **kwargs)

    monkeypatch.setattr(sources, "_sync_file", put_back_meanwhile)
    run = sync(source)
    assert run.status == SyncStatus.SUCCEEDED and run.removed == 1
    assert uris(collection) == file_uris(folder, "a.md", "x.md")
    assert f"{version} version" in Document.objects.get(source_uri=file_uris(folder, "x.md").pop()).raw_content


@pytest.mark.django_db(transaction=True)  # each write commits, as in the worker
def test_a_source_moved_while_it_runs_stops_and_never_takes_a_document_of_its_new_collection(
    roots, collection, monkeypatch
):
    """The run had gone on writing the old collection and recorded those files as the source's, so
    a later sync in the new collection removed a document ingested there by hand."""
    from kb.services import sources

    folder = roots / "docs"
    write(folder, "a.md", "b.md", "c.md")
    other = collection_create(name="other")
    by_hand = document_ingest(collection=other, uri=str(folder / "c.md"), file_roots=[roots]).items[0]
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync_file = sources._sync_file

    def moved_after_the_first(source, *args, **kwargs):
        if Document.objects.filter(collection=collection).exists():
            source_update(source=source, collection=other)
        return sync_file(source, *args, **kwargs)

    monkeypatch.setattr(sources, "_sync_file", moved_after_the_first)
    run = sync_execute(run_id=sync_start(source=source).run.pk, worker="test-worker")
    assert run.status == SyncStatus.FAILED and "moved to another collection" in run.error
    assert len(uris(collection)) == 1 and not item_uris(source)  # one file written before the move
    monkeypatch.setattr(sources, "_sync_file", sync_file)
    sync(source)  # in its new collection: c.md was there before the source found it
    (folder / "c.md").unlink()
    assert sync(source).removed == 0 and Document.objects.filter(pk=by_hand.document.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_edits_of_different_fields_of_a_source_all_stay(roots, collection):
    folder = roots / "docs"
    folder.mkdir()
    other = collection_create(name="other")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    edits = [{"include": ["*.md"]}, {"exclude": ["drafts/*"]}, {"interval_minutes": 90}, {"collection": other}]
    start = threading.Barrier(len(edits))

    def edit(changes: dict) -> None:
        try:
            start.wait(timeout=10)
            source_update(source=Source.objects.get(pk=source.pk), **changes)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=edit, args=(changes,)) for changes in edits]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    edited = Source.objects.get(pk=source.pk)
    assert (edited.include, edited.exclude, edited.interval_minutes, edited.collection_id) == (
        ["*.md"],
        ["drafts/*"],
        90,
        other.pk,
    )


@pytest.mark.django_db(transaction=True)  # each write commits, as in the worker
@pytest.mark.parametrize("deleted", ["source", "collection"])
def test_a_run_whose_source_or_collection_is_deleted_while_it_runs_stops_quietly(
    roots, collection, monkeypatch, caplog, deleted
):
    """The run had raised (a foreign-key violation writing the source's item, or its own row gone)
    and the worker logged an ERROR with a traceback; nothing was left half-written either way."""
    from kb.services import sources

    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync_file = sources._sync_file

    def deleted_meanwhile(source, *args, **kwargs):
        if deleted == "source" and Source.objects.filter(pk=source.pk).exists():
            source_delete(source=source)
        elif deleted == "collection" and Collection.objects.filter(pk=collection.pk).exists():
            collection_delete(name=collection.name, confirm=True)
        return sync_file(source, *args, **kwargs)

    monkeypatch.setattr(sources, "_sync_file", deleted_meanwhile)
    run_id = sync_start(source=source).run.pk
    assert sync_execute(run_id=run_id, worker="test-worker") is None
    assert not SyncRun.objects.filter(pk=run_id).exists() and not SourceItem.objects.exists()
    assert "its source or collection was deleted while it ran" in caplog.text
    assert "Traceback" not in caplog.text and "ERROR" not in caplog.text


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("deleted", ["source", "collection"])
def test_a_deletion_and_a_sync_recording_a_document_it_brought_never_fail_each_other(roots, collection, deleted):
    """A running sync records each document it brings (a SourceItem). One recorded after the
    deletion had cleared the source's records, but before it removed the source, made the deletion
    fail (foreign key, SQLSTATE 23503: DELETE answered 500 in 2 of 4 tries during a sync). Now the
    record waits for the deletion and then finds its source gone."""
    source = source_create(collection=collection, name="docs", folder=str(roots))
    outcome: list[str] = []

    def record() -> None:
        try:
            SourceItem.objects.create(source_id=source.pk, uri="file:///late.md")
            outcome.append("recorded")
        except IntegrityError:
            outcome.append("source gone")
        finally:
            connections.close_all()

    recorder = threading.Thread(target=record)

    def record_meanwhile(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "kb_sourceitem" in sql and sql.lstrip().startswith("DELETE") and not recorder.is_alive():
            recorder.start()
            recorder.join(timeout=2)  # it commits at once, or waits for the deletion
        return result

    with connection.execute_wrapper(record_meanwhile):
        if deleted == "source":
            source_delete(source=source)
        else:
            collection_delete(name=collection.name, confirm=True)
    recorder.join(timeout=30)
    assert outcome == ["source gone"]
    assert not Source.objects.exists() and not SourceItem.objects.exists()


@pytest.mark.django_db(transaction=True)  # each write commits, as in the worker
def test_a_sync_stopped_between_a_document_and_its_record_leaves_neither(roots, collection, monkeypatch):
    """A worker killed after a document committed and before the source's record of it did had
    left a document no later sync would remove (1 of 3 SIGKILLs in a 400-file first sync)."""
    from kb.services import sources

    folder = roots / "docs"
    write(folder, "a.md", "b.md", "c.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    remember = sources._remember

    def killed_at_the_second(source, loaded, *args):
        if loaded.source_uri.endswith("b.md"):
            raise RuntimeError("the worker died here")
        return remember(source, loaded, *args)

    monkeypatch.setattr(sources, "_remember", killed_at_the_second)
    run = sync_execute(run_id=sync_start(source=source).run.pk, worker="test-worker")
    assert run.status == SyncStatus.FAILED and "the worker died here" in run.error
    assert uris(collection) == item_uris(source) == file_uris(folder, "a.md")
    monkeypatch.setattr(sources, "_remember", remember)
    sync(source)
    (folder / "b.md").unlink()
    assert sync(source).removed == 1 and uris(collection) == file_uris(folder, "a.md", "c.md")


def test_removed_counts_the_documents_removed(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync(source)
    Document.objects.filter(source_uri__in=file_uris(folder, "b.md")).delete()  # by hand
    (folder / "a.md").unlink()
    (folder / "b.md").unlink()
    assert counts(sync(source)) == expected(removed=1)
    assert item_uris(source) == set()


def test_moving_a_source_to_another_collection_or_deleting_it_leaves_its_documents(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync(source)
    both = file_uris(folder, "a.md", "b.md")

    first_run = SyncRun.objects.get(source=source)
    other = collection_create(name="other")
    (folder / "b.md").unlink()
    queued = sync_start(source=source).run  # queued in the first collection, run in the other
    source = source_update(source=source, collection=other)
    assert counts(sync_execute(run_id=queued.pk)) == expected(added=1, total=1)
    assert uris(other) == file_uris(folder, "a.md")
    assert uris(collection) == both  # what it brought to the first collection stays there
    # Each run's history says where it ran (it had said where the source is now).
    assert [SyncRunOut.of(run).collection for run in (first_run, SyncRun.objects.get(pk=queued.pk))] == [
        collection.name,
        "other",
    ]

    source_delete(source=source)
    assert not Source.objects.exists() and not SourceItem.objects.exists()
    assert uris(other) == file_uris(folder, "a.md")


# --- 6. one active run per source ---------------------------------------------------------------------


def test_a_source_has_at_most_one_active_run(roots, collection):
    write(roots / "docs", "a.md")
    source = source_create(collection=collection, name="docs", folder=str(roots / "docs"))
    first = sync_start(source=source)
    again = sync_start(source=source)
    assert first.started and not again.started
    assert again.run.pk == first.run.pk
    assert SyncRun.objects.count() == 1

    done = sync_execute(run_id=first.run.pk)
    assert done is not None and done.status == SyncStatus.SUCCEEDED
    assert sync_execute(run_id=first.run.pk) is None  # a run runs once
    following = sync_start(source=source)
    assert following.started and following.run.pk != first.run.pk
    assert not sync_start(source=source).started
    assert SyncRun.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_four_simultaneous_starts_make_one_run(tmp_path, settings):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    write(tmp_path / "docs", "a.md")
    source = source_create(collection=collection_create(name="race"), name="docs", folder=str(tmp_path / "docs"))
    barrier = threading.Barrier(4)
    starts = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            barrier.wait(5)
            starts.append(sync_start(source=source))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert len(starts) == 4
    assert sorted(start.started for start in starts) == [False, False, False, True]
    assert {start.run.pk for start in starts} == set(SyncRun.objects.values_list("pk", flat=True))
    assert SyncRun.objects.count() == 1


# --- 7. the workers' sync step ----------------------------------------------------------------------


def test_the_sync_step_gives_up_a_run_whose_lease_expired_and_it_removed_nothing(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md", "b.md")
    source = source_create(collection=collection, name="docs", folder=str(folder))
    sync(source)
    (folder / "b.md").unlink()
    run = sync_start(source=source).run
    # What a worker that claimed the run and died leaves behind: running, its lease expired.
    SyncRun.objects.filter(pk=run.pk).update(
        status=SyncStatus.RUNNING,
        worker="dead@host",
        started_at=timezone.now() - timedelta(minutes=5),
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    sync_tick()
    run.refresh_from_db()
    assert run.status == SyncStatus.FAILED
    assert "nothing was removed" in run.error
    assert run.finished_at is not None and run.lease_expires_at is None
    assert run.removed == 0
    assert uris(collection) == file_uris(folder, "a.md", "b.md")
    assert sync_execute(run_id=run.pk) is None

    # The source can sync again, and that run removes what is gone.
    assert counts(sync(source)) == expected(unchanged=1, removed=1, total=1)


def test_the_sync_step_leaves_a_running_run_whose_lease_is_alive(roots, collection):
    write(roots / "docs", "a.md")
    source = source_create(collection=collection, name="docs", folder=str(roots / "docs"))
    run = sync_start(source=source).run
    SyncRun.objects.filter(pk=run.pk).update(
        status=SyncStatus.RUNNING, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    sync_tick()
    run.refresh_from_db()
    assert (run.status, run.error) == (SyncStatus.RUNNING, "")


def test_the_sync_step_starts_the_sources_that_are_due_and_only_those(roots, collection):
    write(roots / "docs", "a.md")
    folder = str(roots / "docs")
    due = source_create(collection=collection, name="due", folder=folder, interval_minutes=60)
    Source.objects.filter(pk=due.pk).update(next_sync_at=timezone.now() - timedelta(minutes=1))
    fresh = source_create(collection=collection, name="fresh", folder=folder, interval_minutes=5)
    later = source_create(collection=collection, name="later", folder=folder, interval_minutes=60)
    later_at = timezone.now() + timedelta(minutes=30)
    Source.objects.filter(pk=later.pk).update(next_sync_at=later_at)
    on_demand = source_create(collection=collection, name="on-demand", folder=folder)
    assert on_demand.next_sync_at is None

    before = timezone.now()
    sync_tick()
    after = timezone.now()

    [run] = SyncRun.objects.filter(source=due)
    assert (run.trigger, run.status) == ("schedule", SyncStatus.QUEUED)
    due.refresh_from_db()
    assert before + timedelta(minutes=60) <= due.next_sync_at <= after + timedelta(minutes=60)
    # A new source with a schedule syncs the first time at the next step.
    [fresh_run] = SyncRun.objects.filter(source=fresh)
    assert fresh_run.trigger == "schedule"
    fresh.refresh_from_db()
    assert before + timedelta(minutes=5) <= fresh.next_sync_at <= after + timedelta(minutes=5)
    assert not SyncRun.objects.filter(source__in=[later, on_demand]).exists()
    later.refresh_from_db()
    assert later.next_sync_at == later_at

    sync_tick()  # nothing is due any more
    assert SyncRun.objects.count() == 2

    assert sync_execute(run_id=run.pk).status == SyncStatus.SUCCEEDED
    assert SyncRun.objects.get(pk=run.pk).trigger == "schedule"


def test_the_sync_step_sends_again_a_queued_run_whose_message_was_lost(
    roots, collection, django_capture_on_commit_callbacks
):
    write(roots / "docs", "a.md")
    source = source_create(collection=collection, name="docs", folder=str(roots / "docs"))
    run = sync_start(source=source).run
    SyncRun.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks() as sent:
        sync_tick()
    assert len(sent) == 1
    run.refresh_from_db()
    assert run.status == SyncStatus.QUEUED and run.lease_expires_at > timezone.now()
    with django_capture_on_commit_callbacks() as sent_again:
        sync_tick()
    assert sent_again == []


# --- 8. URL sources: conditional GETs, sitemaps, failures ----------------------------------------------


def test_a_url_source_asks_again_with_if_none_match_and_costs_no_full_answer_when_unchanged(collection, site):
    a = site.page("/a", "Alpha, first version.", etag='"a1"')
    b = site.page("/b", "Bravo, the only version.", etag='"b1"')
    source = source_create(collection=collection, name="site", urls=[a, b])

    assert counts(sync(source)) == expected(added=2, total=2)
    assert uris(collection) == {a, b}
    assert site.full == Counter({"/a": 1, "/b": 1}) and site.if_none_match == []
    assert dict(SourceItem.objects.values_list("uri", "etag")) == {a: '"a1"', b: '"b1"'}
    chunks_before = chunk_ids(collection)

    second = sync(source)
    assert counts(second) == expected(unchanged=2, total=2)
    assert sorted(site.if_none_match) == [("/a", '"a1"'), ("/b", '"b1"')]
    assert site.not_modified == Counter({"/a": 1, "/b": 1})
    assert site.full == Counter({"/a": 1, "/b": 1})  # no 200 for the second sync
    assert chunk_ids(collection) == chunks_before

    site.page("/a", "Alpha, second version.", etag='"a2"')
    third = sync(source)
    assert counts(third) == expected(updated=1, unchanged=1, total=2)
    assert site.full == Counter({"/a": 2, "/b": 1})
    assert "second version" in Document.objects.get(source_uri=a).raw_content
    assert SourceItem.objects.get(uri=a).etag == '"a2"'
    assert uris(collection) == {a, b}


def test_a_sitemap_lists_the_pages_and_a_page_dropped_from_it_is_removed(collection, site):
    for name in ("p1", "p2", "p3"):
        site.page(f"/{name}", f"The page called {name}.")
    sitemap = site.sitemap("/sitemap.xml", ["/p1", "/p2", "/p3"])
    source = source_create(collection=collection, name="site", sitemap_url=sitemap)
    assert counts(sync(source)) == expected(added=3, total=3)
    assert uris(collection) == {site.url("/p1"), site.url("/p2"), site.url("/p3")}

    site.sitemap("/sitemap.xml", ["/p1", "/p2"])
    run = sync(source)
    assert run.status == SyncStatus.SUCCEEDED
    assert counts(run) == expected(unchanged=2, removed=1, total=2)
    assert uris(collection) == {site.url("/p1"), site.url("/p2")}
    assert item_uris(source) == {site.url("/p1"), site.url("/p2")}


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("/p3", "'/p3'"),
        ("&gone;", "''"),
        ("ftp://example.org/p3", "'ftp://example.org/p3'"),
        ("http:///p3", "'http:///p3'"),
        ("http://[::1/p3", "'http://[::1/p3'"),  # urlsplit raises: the run had failed as an internal error
    ],
)
def test_a_sitemap_location_that_is_no_page_url_is_reported_and_nothing_is_removed(collection, site, location, shown):
    """A relative path, an entity left unexpanded or another scheme had been skipped in silence: the
    page looked dropped from the site and its document was removed (an entity: all of them)."""
    for name in ("p1", "p2", "p3"):
        site.page(f"/{name}", f"The page called {name}.")
    body = '<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY gone "x">]>'
    body += '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{}</urlset>'
    listed = "".join(f"<url><loc>{site.url(f'/{name}')}</loc></url>" for name in ("p1", "p2", "p3"))
    sitemap = site.raw("/sitemap.xml", body.format(listed))
    source = source_create(collection=collection, name="site", sitemap_url=sitemap)
    assert counts(sync(source)) == expected(added=3, total=3)

    site.raw("/sitemap.xml", body.format(f"<url><loc>{site.url('/p1')}</loc></url><url><loc>{location}</loc></url>"))
    run = sync(source)
    assert (
        run.error
        == f"{sitemap} lists 1 <loc> that is no absolute http(s) URL (the first: {shown}); nothing was removed"
    )
    assert counts(run) == expected(unchanged=1, total=1)
    assert uris(collection) == {site.url(f"/{name}") for name in ("p1", "p2", "p3")}


def test_a_sitemap_location_s_scheme_is_read_in_any_case(collection, site):
    site.page("/p1", "The page called p1.")
    sitemap = site.raw(
        "/sitemap.xml",
        '<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>HTTP{site.url('/p1')[4:]}</loc></url></urlset>",
    )
    run = sync(source_create(collection=collection, name="site", sitemap_url=sitemap))
    assert (counts(run), run.error) == (expected(added=1, total=1), "")
    assert uris(collection) == {site.url("/p1")}


def test_a_page_that_answers_500_is_counted_failed_with_its_reason_and_kept(collection, site):
    good = site.page("/good", "A good page.")
    flaky = site.page("/flaky", "A flaky page.")
    source = source_create(collection=collection, name="site", urls=[good, flaky])
    assert counts(sync(source)) == expected(added=2, total=2)

    site.page("/flaky", "A flaky page.", status=500)
    broken = site.page("/broken", "never served", status=500)
    source = source_update(source=source, urls=[good, flaky, broken])
    run = sync(source)
    assert run.status == SyncStatus.SUCCEEDED and run.error == ""
    assert counts(run) == expected(unchanged=1, failed=2, total=3)
    assert sorted(run.failures, key=lambda failure: failure["uri"]) == [
        {"uri": broken, "code": "LOAD_FAILED", "message": f"{broken} answered HTTP 500"},
        {"uri": flaky, "code": "LOAD_FAILED", "message": f"{flaky} answered HTTP 500"},
    ]
    assert uris(collection) == {good, flaky}  # the failing page keeps its document


# --- 9. guards --------------------------------------------------------------------------------------


def refused(code: ErrorCode, **fields) -> str:
    before = Source.objects.count()
    with pytest.raises(KBError) as error:
        source_create(**fields)
    assert error.value.code == code, error.value.message
    assert Source.objects.count() == before
    return error.value.message


def test_a_folder_outside_the_roots_or_without_roots_is_refused(collection, settings, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    write(root, "a.md")
    write(outside, "b.md")
    (root / "escape").symlink_to(outside)
    settings.KB_FILE_ROOTS = [str(root)]
    for folder in (outside, root / "escape", f"{root}/../outside", outside.as_uri()):
        message = refused(ErrorCode.INVALID_URI, collection=collection, name="x", folder=str(folder))
        assert "outside" in message
    assert "is not a folder" in refused(
        ErrorCode.INVALID_URI, collection=collection, name="x", folder=str(root / "a.md")
    )
    settings.KB_FILE_ROOTS = []
    assert "KB_FILE_ROOTS" in refused(ErrorCode.INVALID_URI, collection=collection, name="x", folder=str(root))


@pytest.mark.parametrize(
    "fields",
    [
        {"urls": ["http://127.0.0.1:9/page"]},
        {"sitemap_url": "http://127.0.0.1:9/sitemap.xml"},
        {"urls": ["http://[::1]/"]},
        {"urls": ["http://2130706433/"]},  # forms of 127.0.0.1 the resolver takes too
        {"urls": ["http://127.1/"]},
        {"sitemap_url": "http://0x7f000001/sitemap.xml"},
        {"urls": ["http://0177.0.0.1/"]},
    ],
)
def test_a_url_source_on_a_private_address_is_refused_unless_allowed(collection, settings, fields):
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = []
    assert "not a public address" in refused(ErrorCode.INVALID_URI, collection=collection, name="x", **fields)


@pytest.mark.parametrize("host", ["localhost", "docs.localhost", "LOCALHOST."])
def test_localhost_by_name_is_refused_when_a_source_is_saved(collection, settings, host):
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = []
    assert "not a public address" in refused(
        ErrorCode.INVALID_URI, collection=collection, name="x", urls=[f"http://{host}:9/page"]
    )


def test_saving_urls_asks_no_dns_and_a_fetch_judges_the_name(collection, settings):
    """A name is judged when a fetch resolves it: saving one that does not resolve costs no lookup
    and succeeds; its sync then fails that URL with the reason and removes nothing."""
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = []
    source = source_create(collection=collection, name="x", urls=["https://no-such-host.invalid/page"])
    run = sync(source)
    assert counts(run) == expected(failed=1, total=1)
    assert run.failures[0]["code"] == "LOAD_FAILED" and "Cannot resolve" in run.failures[0]["message"]


def test_a_sitemap_index_is_read_up_to_its_first_twenty_sitemaps_or_the_setting(collection, site, settings):
    nested = []
    for number in range(25):
        site.page(f"/p{number}", f"Page number {number}.")
        nested.append(site.sitemap(f"/sitemap-{number}.xml", [f"/p{number}"]))
    locations = "".join(f"<sitemap><loc>{url}</loc></sitemap>" for url in nested)
    index = site.raw(
        "/index.xml",
        f'<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locations}'
        "</sitemapindex>",
    )
    source = source_create(collection=collection, name="indexed", sitemap_url=index)
    run = sync(source)
    assert counts(run) == expected(added=20, total=20)
    assert run.error == (
        "The sitemap index lists 25 sitemaps; only the first 20 were read (KB_SOURCE_MAX_SITEMAPS); nothing was removed"
    )
    assert uris(collection) == {site.url(f"/p{number}") for number in range(20)}
    assert sorted(path for path in site.requested if path.startswith("/sitemap-")) == sorted(
        f"/sitemap-{number}.xml" for number in range(20)
    )
    settings.KB_SOURCE_MAX_SITEMAPS = 25  # a bigger site: its operator raises the setting
    again = sync(source)
    assert (counts(again), again.error) == (expected(added=5, unchanged=20, total=25), "")


def test_a_sitemap_index_inside_a_sitemap_index_is_reported_and_nothing_is_removed(collection, site):
    for number in range(3):
        site.page(f"/p{number}", f"Page number {number}.")
    first = site.sitemap("/sitemap-0.xml", ["/p0", "/p1"])
    index = '<?xml version="1.0"?><sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{}</sitemapindex>'
    listing = "".join(
        f"<sitemap><loc>{url}</loc></sitemap>" for url in (first, site.sitemap("/sitemap-1.xml", ["/p2"]))
    )
    outer = site.raw("/index.xml", index.format(listing))
    source = source_create(collection=collection, name="indexed", sitemap_url=outer)
    assert counts(sync(source)) == expected(added=3, total=3)
    nested = site.raw("/nested.xml", index.format(f"<sitemap><loc>{site.url('/sitemap-1.xml')}</loc></sitemap>"))
    site.raw("/index.xml", index.format(f"<sitemap><loc>{first}</loc></sitemap><sitemap><loc>{nested}</loc></sitemap>"))
    run = sync(source)
    assert run.error == f"{nested} is a sitemap index inside a sitemap index; it was not read; nothing was removed"
    assert uris(collection) == {site.url(f"/p{number}") for number in range(3)}


@pytest.mark.parametrize(
    "url", ["https://user:secret@example.org/a", "https://token@example.org/a", "https://:pw@example.org/"]
)
def test_a_url_holding_credentials_is_refused_as_a_source_and_as_a_document(collection, url):
    """It was stored and shown to every read token (a source's URLs, a document's source URI)."""
    message = refused(ErrorCode.INVALID_URI, collection=collection, name="x", urls=[url])
    assert "user name or password" in message and "secret" not in message
    refused(ErrorCode.INVALID_URI, collection=collection, name="x", sitemap_url=url)
    with pytest.raises(KBError) as raised:
        document_ingest(collection=collection, uri=url, file_roots=[])
    assert raised.value.code == ErrorCode.INVALID_URI
    assert not Document.objects.exists()


def test_only_http_urls_are_followed(collection):
    refused(ErrorCode.INVALID_URI, collection=collection, name="x", urls=["file:///etc/passwd"])
    refused(ErrorCode.INVALID_URI, collection=collection, name="x", urls=["ftp://example.org/a"])
    too_long = "https://example.org/" + "a" * 4077  # 4,097 characters: no document could hold it
    for fields in ({"urls": [too_long]}, {"sitemap_url": too_long}):
        assert "at most 4096" in refused(ErrorCode.INVALID_URI, collection=collection, name="x", **fields)
    assert source_create(collection=collection, name="x", urls=[too_long[:-1]]).urls == [too_long[:-1]]


def test_source_fields_are_checked(roots, collection, settings):
    settings.KB_FETCH_ALLOWED_PRIVATE_HOSTS = ["127.0.0.1"]
    settings.KB_SOURCE_MAX_URLS = 2
    write(roots / "docs", "a.md")
    folder = str(roots / "docs")
    base = {"collection": collection, "name": "docs"}
    page = "http://127.0.0.1:9/page"
    assert "not both" in refused(ErrorCode.INVALID_ARGUMENT, **base, folder=folder, urls=[page])
    assert "not both" in refused(ErrorCode.INVALID_ARGUMENT, **base, folder=folder, sitemap_url=page)
    refused(ErrorCode.INVALID_ARGUMENT, **base)
    for name in ("has space", "", "a/b", "x" * 101, "naïve"):
        assert "Invalid source name" in refused(
            ErrorCode.INVALID_ARGUMENT, collection=collection, name=name, folder=folder
        )
    for interval in (0, -5, MAX_INTERVAL_MINUTES + 1, 1.5, "60"):
        message = refused(ErrorCode.INVALID_ARGUMENT, **base, folder=folder, interval_minutes=interval)
        assert "interval_minutes" in message
    three = [f"http://127.0.0.1:9/{n}" for n in range(3)]
    assert "KB_SOURCE_MAX_URLS" in refused(ErrorCode.INVALID_ARGUMENT, **base, urls=three)
    assert source_create(**base, urls=[*three[:2], three[0]]).urls == three[:2]  # duplicates count once
    assert "already exists" in refused(ErrorCode.INVALID_ARGUMENT, **base, folder=folder)
    refused(ErrorCode.INVALID_ARGUMENT, collection=collection, name="g", folder=folder, include="*.md")
    refused(ErrorCode.INVALID_ARGUMENT, collection=collection, name="g", folder=folder, exclude=["x"] * 51)


def test_source_update_is_checked_like_source_create(roots, collection):
    write(roots / "docs", "a.md")
    folder = str(roots / "docs")
    source_create(collection=collection, name="taken", folder=folder)
    source = source_create(collection=collection, name="docs", folder=folder)
    for changes, code in [
        ({"name": "taken"}, ErrorCode.INVALID_ARGUMENT),
        ({"colour": "red"}, ErrorCode.INVALID_ARGUMENT),
        ({"interval_minutes": 0}, ErrorCode.INVALID_ARGUMENT),
        ({"folder": str(roots.parent)}, ErrorCode.INVALID_URI),
    ]:
        with pytest.raises(KBError) as error:
            source_update(source=source, **changes)
        assert error.value.code == code, changes
    stored = Source.objects.get(pk=source.pk)
    assert (stored.name, stored.folder, stored.interval_minutes) == ("docs", str(Path(folder).resolve()), None)


def test_a_hostile_sitemap_expands_no_external_entity(collection, site, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(site.url("/secret-page") + "\n")
    site.page("/secret-page", "What the entity would have revealed.")
    site.page("/page", "An ordinary page.")
    xml = (
        '<?xml version="1.0"?>'
        f'<!DOCTYPE urlset [<!ENTITY secret SYSTEM "{secret.as_uri()}"><!ENTITY passwd SYSTEM "file:///etc/passwd">]>'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>&secret;</loc></url><url><loc>{site.url('/page')}?&passwd;</loc></url></urlset>"
    )
    source = source_create(collection=collection, name="hostile", sitemap_url=site.raw("/sitemap.xml", xml))
    started = time.monotonic()
    run = sync(source)
    assert time.monotonic() - started < 5
    assert SyncRunOut.of(run).done
    assert not any(path.startswith("/secret-page") for path in site.requested), site.requested
    assert not any("root:" in path for path in site.requested)
    shown = [run.error, *(failure["message"] for failure in run.failures), *(f["uri"] for f in run.failures)]
    assert not any("root:" in text for text in shown)
    assert site.url("/secret-page") not in uris(collection)
    assert not Document.objects.filter(raw_content__contains="root:").exists()
    assert not Document.objects.filter(source_uri__contains="root:").exists()


def test_a_billion_laughs_sitemap_is_refused_at_once(collection, site):
    entities = '<!ENTITY lol "lol">' + "".join(
        f'<!ENTITY lol{n} "{("&lol;" if n == 1 else f"&lol{n - 1};") * 10}">' for n in range(1, 10)
    )
    xml = (
        f'<?xml version="1.0"?><!DOCTYPE urlset [{entities}]>'
        '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
        f"<url><loc>{site.url('/page')}?&lol9;</loc></url></urlset>"
    )
    kept = site.page("/kept", "A page synced before the sitemap turned hostile.")
    source = source_create(collection=collection, name="laughs", urls=[kept])
    sync(source)
    source = source_update(source=source, urls=[], sitemap_url=site.raw("/sitemap.xml", xml))
    started = time.monotonic()
    run = sync(source)
    assert time.monotonic() - started < 5
    assert run.status == SyncStatus.FAILED
    assert "sitemap could not be read" in run.error and "nothing was removed" in run.error
    assert len(run.error) < 2000
    assert uris(collection) == {kept}
    assert not any(path.startswith("/page") for path in site.requested)


# --- 10. the shape every door shows a run in -----------------------------------------------------------


def test_sync_run_out_shows_a_run_from_queued_to_done(roots, collection):
    folder = roots / "docs"
    write(folder, "a.md")
    (folder / "image.md").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))  # fails: not text
    source = source_create(collection=collection, name="docs", folder=str(folder))
    queued = sync_start(source=source).run
    shown = SyncRunOut.of(queued)
    assert (shown.status, shown.done, shown.duration_seconds, shown.started_at) == ("queued", False, None, None)
    assert (shown.job_id, shown.source, shown.collection, shown.trigger) == (queued.pk, "docs", "synced", "manual")

    run = sync_execute(run_id=queued.pk)
    shown = SyncRunOut.of(run)
    assert (shown.status, shown.done, shown.error) == ("succeeded", True, "")
    assert shown.duration_seconds == (run.finished_at - run.started_at).total_seconds() >= 0
    assert (shown.total, shown.processed, shown.added, shown.failed) == (2, 2, 1, 1)
    assert [failure.model_dump() for failure in shown.failures] == [
        {"uri": (folder / "image.md").resolve().as_uri(), "code": "LOAD_FAILED", "message": shown.failures[0].message}
    ]
    assert "PNG" in shown.failures[0].message
    assert shown.summary == "1 added, 0 updated, 0 unchanged, 0 removed, 1 failed"
    assert set(shown.model_dump()["failures"][0]) == {"uri", "code", "message"}

    shutil.rmtree(folder)
    failed = SyncRunOut.of(sync(source))
    assert (failed.status, failed.done, failed.failures) == ("failed", True, [])
    assert failed.error and failed.summary.endswith(f". {failed.error}")
    assert failed.duration_seconds is not None and failed.duration_seconds >= 0


# --- a run given up while its worker still works ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_given_up_while_its_worker_still_works_removes_nothing(site):
    collection = collection_create(name="zombie")
    a = site.page("/a", "Alpha, a page that stays.")
    b = site.page("/b", "Bravo, a page the source stops following.")
    source = source_create(collection=collection, name="zombie", urls=[a, b])
    assert counts(sync(source)) == expected(added=2, total=2)
    source = source_update(source=source, urls=[a])  # a complete sync now removes b

    entered, release = site.hold("/a")
    run_id = sync_start(source=source).run.pk
    outcome: dict[str, object] = {}

    def slow_worker() -> None:
        try:
            outcome["run"] = sync_execute(run_id=run_id, worker="slow@host")
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error
        finally:
            connection.close()

    worker = threading.Thread(target=slow_worker)
    worker.start()
    try:
        assert entered.wait(5), "the worker never fetched /a"
        # The worker did not renew its lease in time: another worker's sync step gives the run up.
        SyncRun.objects.filter(pk=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        sync_tick()
        given_up = SyncRun.objects.get(pk=run_id)
        assert given_up.status == SyncStatus.FAILED and "nothing was removed" in given_up.error
    finally:
        release.set()
        worker.join(10)
    assert not worker.is_alive()
    given_up = SyncRun.objects.get(pk=run_id)
    assert given_up.status == SyncStatus.FAILED and "nothing was removed" in given_up.error
    assert uris(collection) == {a, b}, f"the given-up run removed documents (sync_execute gave {outcome!r})"
    assert "error" not in outcome, f"sync_execute raised {outcome.get('error')!r}"
    assert outcome["run"].status == SyncStatus.FAILED
