"""No lost writes: concurrent batches of chunks for one source all keep their chunks, through the
service from many threads (each with its own database connection) and through a real MCP server
from many clients at once, as SciRAG's store_document_chunks is used."""

import threading
import time

import anyio
import pytest
from django.db import connection, transaction

from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import parse
from kb.models import Chunk, Collection, Document
from kb.services.collections import collection_create, collection_delete, collection_update
from kb.services.documents import collection_hold, document_create_from_text, document_delete
from kb.services.embedding_pipeline import document_claim, document_embed
from kb.services.ingest import (
    ChunkInput,
    IngestItem,
    document_reingest,
    document_store_chunk_batch,
    document_store_chunks,
    ingest_refusals_record,
)
from kb.services.sources import source_create, sync_execute, sync_start
from tests.support.mcp_client import committed_db, http_session, structured, tool_threads  # noqa: F401
from tests.support.mcp_server import uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

WRITERS = 20


def run_at_once(count: int, work) -> list[BaseException]:
    """``work(i)`` in ``count`` threads released together; the errors they raised."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(timeout=30)
            work(index)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def test_concurrent_batches_for_one_source_keep_every_chunk():
    collection = collection_create(name="notes")

    def store(index: int) -> None:
        document_store_chunks(
            collection=collection,
            source_uri="paper.pdf",
            chunks=[ChunkInput(index, f"Finding number {index} about turbulence.", {"batch": index})],
            metadata={f"batch_{index}": True},
        )

    assert run_at_once(WRITERS, store) == []
    document = Document.objects.get(source_uri="paper.pdf")
    assert sorted(Chunk.objects.filter(document=document).values_list("index", flat=True)) == list(range(WRITERS))
    assert document.chunk_count == WRITERS
    assert all(document.metadata[f"batch_{index}"] for index in range(WRITERS))


def test_batches_of_several_sources_and_writers_of_one_never_deadlock():
    """SciRAG batches naming sources a and b, at once with writers of a or b alone: every call
    succeeds and keeps its chunk. A batch had held the collection's counters from its first
    source while it waited for the second source's lock, which that source's writer held while it
    waited for the counters: about a quarter of the calls ended in a deadlock (DATABASE_ERROR)."""
    collection_create(name="multi")
    writers = 30

    def store(index: int) -> None:
        sources = [["a", "b"], ["b"], ["a"]][index % 3]
        document_store_chunk_batch(
            collection_name="multi",
            chunks=[ChunkInput(index, f"Finding {index} of source {source}.") for source in sources],
            sources=sources,
            create_collection=True,
        )

    assert run_at_once(writers, store) == []
    for source in ("a", "b"):
        stored = Chunk.objects.filter(document__source_uri=source).values_list("index", flat=True)
        assert sorted(stored) == [n for n in range(writers) if source in [["a", "b"], ["b"], ["a"]][n % 3]]


def test_an_upload_racing_its_collection_s_deletion_is_collection_not_found():
    """Uploads whose refused files are recorded, while the collection is deleted: each answers
    or is COLLECTION_NOT_FOUND. Recording a refusal for a collection deleted meanwhile had been a
    foreign-key violation at commit (a 500)."""
    for attempt in range(5):
        collection = collection_create(name=f"doomed-{attempt}")

        def race(index: int, collection=collection) -> None:
            if index == 0:
                collection_delete(name=collection.name, confirm=True)
                return
            items = [
                IngestItem(
                    source_uri=f"upload://{index}.bin", outcome="failed", error=KBError(ErrorCode.LOAD_FAILED, "x")
                )
            ]
            ingest_refusals_record(collection=collection, items=items)

        errors = run_at_once(8, race)
        assert [e for e in errors if not (isinstance(e, KBError) and e.code == "COLLECTION_NOT_FOUND")] == []
        assert not Collection.objects.filter(pk=collection.pk).exists()


def test_a_batch_that_repeats_an_index_replaces_only_that_chunk():
    collection = collection_create(name="replace")
    first = [ChunkInput(index, f"First version of part {index}.") for index in range(3)]
    document_store_chunks(collection=collection, source_uri="s.txt", chunks=first)
    document_store_chunks(
        collection=collection, source_uri="s.txt", chunks=[ChunkInput(1, "Second version of part 1.")]
    )
    stored = dict(Chunk.objects.filter(document__source_uri="s.txt").values_list("index", "content"))
    assert stored == {0: "First version of part 0.", 1: "Second version of part 1.", 2: "First version of part 2."}


def test_concurrent_settings_changes_keep_each_others_fields():
    collection = collection_create(name="settings")
    changes = [{"description": "described"}, {"search_top_k": 7}, {"search_hybrid": False}, {"semantic_weight": 0.3}]

    def update(index: int) -> None:
        # Each writer holds its own stale copy of the row, as the admin and the API do.
        collection_update(collection=Collection.objects.get(pk=collection.pk), **changes[index])

    assert run_at_once(len(changes), update) == []
    collection.refresh_from_db()
    assert (collection.description, collection.search_top_k, collection.search_hybrid, collection.semantic_weight) == (
        "described", 7, False, 0.3
    )  # fmt: skip


def test_writers_that_come_after_a_waiting_settings_change_wait_for_it():
    """Writers hold the collection's row FOR KEY SHARE, and Postgres lets a new share locker
    overtake one waiting to update the row: under four steady writers a model switch waited 9-120 s
    for its turn, or never got it. A writer held one second, a settings change waits for it, a
    second writer comes: it must see the change, as the change went first."""
    collection = collection_create(name="fair")
    first_holds, second_asked = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def first_writer() -> None:
        with transaction.atomic():
            collection_hold(collection=collection)
            first_holds.set()
            second_asked.wait(timeout=30)
            time.sleep(0.5)  # the second writer asks meanwhile

    def change() -> None:
        collection_update(collection=collection, description="changed")

    def second_writer() -> None:
        second_asked.set()
        with transaction.atomic():
            collection_hold(collection=collection)
            outcomes["seen"] = Collection.objects.get(pk=collection.pk).description

    threads = [threading.Thread(target=recorded(first_writer, outcomes, "first"))]
    threads[0].start()
    assert first_holds.wait(timeout=30)
    threads.append(threading.Thread(target=recorded(change, outcomes, "change")))
    threads[1].start()
    wait_for_a_lock_wait()
    threads.append(threading.Thread(target=recorded(second_writer, outcomes, "second")))
    threads[2].start()
    for thread in threads:
        thread.join(timeout=60)
    assert outcomes == {"seen": "changed"}


def test_a_sync_parsing_a_changed_file_holds_up_no_other_writer(settings, tmp_path, monkeypatch):
    """A sync keeps its transaction open through a file's parse (the document commits with the
    sync's record of it); it had taken the source's lock, with the collection's BM25 counters,
    before parsing, so every writer of the collection waited for the parse (up to 20 s)."""
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    (tmp_path / "slow.md").write_text("# Slow\n\nA file whose parse takes its time.\n")
    collection = collection_create(name="syncing")
    source = source_create(collection=collection, name="slow", folder=str(tmp_path))
    parsing, parsed = threading.Event(), threading.Event()

    def slow_parse(*args, **kwargs):
        parsing.set()
        assert parsed.wait(timeout=30)
        return parse(*args, **kwargs)

    monkeypatch.setattr("kb.services.ingest.parse", slow_parse)
    outcomes: dict[str, object] = {}

    def run_sync() -> None:
        outcomes["added"] = sync_execute(run_id=sync_start(source=source).run.pk, worker="test").added

    syncing = threading.Thread(target=recorded(run_sync, outcomes, "sync"))
    syncing.start()
    assert parsing.wait(timeout=30)
    writer = threading.Thread(
        target=recorded(
            lambda: document_create_from_text(collection=collection, source_uri="note://n", text="Lift."),
            outcomes,
            "note",
        )
    )
    writer.start()
    writer.join(timeout=10)
    written_during_the_parse = not writer.is_alive()
    parsed.set()
    for thread in (writer, syncing):
        thread.join(timeout=60)
    assert written_during_the_parse
    assert outcomes == {"added": 1}


@pytest.fixture(scope="module")
def server_url(django_db_setup, tmp_path_factory):
    with uvicorn_server(tmp_path_factory.mktemp("uvicorn"), {}) as url:
        yield url


def test_concurrent_scirag_clients_storing_chunks_of_one_file_lose_none(server_url):
    async def store(index: int) -> dict:
        async with http_session(f"{server_url}/profiles/scirag/mcp") as session:
            chunk = {
                "text": f"Observation {index} on boundary layers.",
                "source_filename": "run.pdf",
                "chunk_index": index,
            }
            return structured(
                await session.call_tool("store_document_chunks", {"chunks": [chunk], "collection": "lab"})
            )

    async def run() -> list[dict]:
        results: list[dict] = [{}] * WRITERS

        async def one(index: int) -> None:
            results[index] = await store(index)

        async with anyio.create_task_group() as group:
            for index in range(WRITERS):
                group.start_soon(one, index)
        return results

    results = anyio.run(run)
    assert [result["success"] for result in results] == [True] * WRITERS
    stored = Chunk.objects.filter(document__source_uri="run.pdf", collection__name="lab")
    assert sorted(stored.values_list("index", flat=True)) == list(range(WRITERS))


def test_deleting_documents_while_their_sources_are_written_again_never_deadlocks():
    """Each of 10 documents deleted while its source is written again, all at once: every call
    succeeds in some order. Locking a document had locked its collection's row too (FOR UPDATE),
    against the writers' FOR KEY SHARE on it: most deletes ended in a deadlock (DATABASE_ERROR)."""
    collection = collection_create(name="races")
    pairs = 10
    documents = [
        document_create_from_text(collection=collection, source_uri=f"note://{n}", text=f"Version 0 of note {n}.")
        for n in range(pairs)
    ]

    def race(index: int) -> None:
        n = index // 2
        if index % 2:
            document_delete(doc_id=documents[n].document.pk)
        else:
            document_create_from_text(collection=collection, source_uri=f"note://{n}", text=f"Version 1 of note {n}.")

    errors = run_at_once(2 * pairs, race)
    # A write that came after its delete made the note again; one before it was deleted with it.
    assert [error for error in errors if not (isinstance(error, KBError) and error.code == "DOCUMENT_NOT_FOUND")] == []
    for document in Document.objects.filter(collection=collection):
        assert document.raw_content.startswith("Version 1")


def test_reingesting_while_a_new_version_is_written_never_brings_the_old_text_back():
    """A re-ingest re-chunks the stored text it read; if a newer version is written meanwhile, the
    newer one stays (it had been overwritten with the older text it replaced)."""
    collection = collection_create(name="versions")
    notes = 10
    documents = [
        document_create_from_text(collection=collection, source_uri=f"note://{n}", text=f"Version 0 of note {n}. " * 30)
        for n in range(notes)
    ]

    def race(index: int) -> None:
        n = index // 2
        if index % 2:
            document_reingest(doc_id=documents[n].document.pk, file_roots=[])
        else:
            document_create_from_text(
                collection=collection, source_uri=f"note://{n}", text=f"Version 1 of note {n}. " * 30
            )

    assert run_at_once(2 * notes, race) == []
    for document in Document.objects.filter(collection=collection):
        assert document.raw_content.startswith("Version 1"), document.source_uri


def test_reingesting_a_deleted_document_does_not_bring_it_back():
    collection = collection_create(name="gone")
    stored = document_create_from_text(collection=collection, source_uri="note://gone", text="Soon deleted.")
    document_delete(doc_id=stored.document.pk)
    with pytest.raises(KBError) as error:
        document_reingest(doc_id=stored.document.pk, file_roots=[])
    assert error.value.code == ErrorCode.DOCUMENT_NOT_FOUND


def test_deleting_a_collection_while_a_document_of_it_is_embedded_never_deadlocks():
    """The embedder stores a batch of vectors (their rows refer to the collection) while the
    collection is deleted. It had locked the document's row first and the collection's key second,
    the deletion the other way round: DELETE answered 500 (SQLSTATE 40P01) in 6 of 40 races. The
    embedder is held just after the statement that locks the document until the deletion waits."""
    collection = collection_create(name="doomed")
    document = document_create_from_text(collection=collection, source_uri="note://x", text="Lift and drag.").document
    assert document_claim(doc_id=document.pk)
    embedder_holds, go_on = threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}

    def hold_after_the_document_lock(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith('UPDATE "kb_document" SET "lease_expires_at"') and not embedder_holds.is_set():
            embedder_holds.set()
            go_on.wait(timeout=30)
        return result

    def embed() -> None:
        with connection.execute_wrapper(hold_after_the_document_lock):
            outcomes["embed"] = document_embed(doc_id=document.pk)

    def delete() -> None:
        outcomes["delete"] = collection_delete(name="doomed", confirm=True).documents

    threads = {"embed": threading.Thread(target=recorded(embed, outcomes, "embed"))}
    threads["embed"].start()
    assert embedder_holds.wait(timeout=60)
    threads["delete"] = threading.Thread(target=recorded(delete, outcomes, "delete"))
    threads["delete"].start()
    wait_for_a_lock_wait()
    go_on.set()
    for thread in threads.values():
        thread.join(timeout=60)
    assert outcomes == {"embed": "deleted", "delete": 1}
    assert not Collection.objects.filter(name="doomed").exists()


def recorded(work, outcomes: dict[str, object], name: str):
    def run() -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            outcomes[name] = error
        finally:
            connection.close()

    return run


def wait_for_a_lock_wait(timeout: float = 30) -> None:
    """Until another session waits for a lock (or the time is up, when nothing has to wait)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)
