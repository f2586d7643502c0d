"""Embedding through a real Celery worker process on the default file-system broker."""

import contextlib
import io
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Count

from kb.models import Chunk, Collection, Document, DocumentStatus, Embedding, WorkerHeartbeat
from kb.selectors.collections import collection_reembedding
from kb.services import embedding_pipeline
from kb.services.collections import collection_create
from kb.services.documents import collection_lock, document_create_from_text, document_mark_pending
from kb.services.embedding_pipeline import document_claim, document_embed, insert_vectors, vectors_prune
from kb.services.model_switch import collection_reembed_cancel, collection_reembed_step, collection_switch_model
from tests.conftest import free_port, start_worker, wait_for
from tests.support.fake_providers import (
    DIMENSIONS,
    _ollama_embed,
    _openai_embeddings,
    fake_ollama,
    fake_openai,
    fake_vector,
    remote_collection,
)
from tests.support.http_server import serve

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LONG_TEXT = "\n\n".join(
    f"Section {n}. " + f"Wind tunnel measurement {n} of lift and drag at Mach {n}. " * 3 for n in range(120)
)


def status_of(document: Document) -> str:
    document.refresh_from_db()
    return document.status


def wait_until_status(document: Document, status: str, worker, timeout: float = 180) -> None:
    try:
        wait_for(lambda: status_of(document) == status, timeout=timeout, what=f"{document.pk} to be {status}")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}: status {document.status}, error {document.error!r}\n{worker.log()[-4000:]}"
        ) from None


def vectors_per_chunk(document: Document, model_id: int) -> list[int]:
    counts = (
        Embedding.objects.filter(chunk__document=document, model_id=model_id)
        .values("chunk_id")
        .annotate(n=Count("id"))
        .values_list("n", flat=True)
    )
    return sorted(counts)


def test_a_document_goes_from_pending_to_ready_with_every_chunk_embedded(celery_worker):
    collection = collection_create(name="docs")
    document = document_create_from_text(collection=collection, source_uri="note://x", text=LONG_TEXT).document
    assert document.status == DocumentStatus.PENDING
    # Keyword-searchable at once: the chunks and their full-text vectors exist before embedding.
    assert Chunk.objects.filter(document=document, search_vector__isnull=False).count() == document.chunk_count
    wait_until_status(document, DocumentStatus.READY, celery_worker)
    assert document.embedded_count == document.chunk_count
    assert vectors_per_chunk(document, collection.embedding_model_id) == [1] * document.chunk_count


def test_killing_the_worker_mid_document_loses_nothing(tmp_path):
    collection = collection_create(name="docs", chunk_max_tokens=24, chunk_min_tokens=0)
    document = document_create_from_text(collection=collection, source_uri="note://long", text=LONG_TEXT).document
    assert document.chunk_count > 150
    quick_takeover = {"KB_EMBED_LEASE_SECONDS": "10", "KB_SWEEP_INTERVAL_SECONDS": "5", "EMBEDDING_BATCH_SIZE": "4"}
    first = start_worker(tmp_path, extra_env=quick_takeover, name="doomed")
    try:
        wait_for(
            lambda: 0 < Document.objects.get(pk=document.pk).embedded_count < document.chunk_count // 2,
            timeout=120,
            interval=0.05,
            what="embedding to be under way",
        )
        first.kill(signal.SIGKILL)  # the worker and its pool child, mid-batch
        first.process.wait()
    finally:
        first.stop()
    assert status_of(document) == DocumentStatus.PROCESSING
    second = start_worker(tmp_path, extra_env=quick_takeover, name="successor")
    try:
        wait_until_status(document, DocumentStatus.READY, second)
    finally:
        second.stop()
    assert document.embedded_count == document.chunk_count
    assert vectors_per_chunk(document, collection.embedding_model_id) == [1] * document.chunk_count


def test_a_deleted_document_is_tolerated_by_its_task(celery_worker):
    collection = collection_create(name="docs", chunk_max_tokens=24, chunk_min_tokens=0)
    doomed = document_create_from_text(collection=collection, source_uri="note://gone", text=LONG_TEXT).document
    Document.objects.filter(pk=doomed.pk).delete()
    survivor = document_create_from_text(collection=collection, source_uri="note://kept", text="Short note.").document
    wait_until_status(survivor, DocumentStatus.READY, celery_worker)
    assert "Traceback" not in celery_worker.log()
    assert not Embedding.objects.filter(chunk__document_id=doomed.pk).exists()


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_remote_providers_embed_through_the_worker(tmp_path, provider, settings):
    fake = fake_ollama() if provider == "ollama" else fake_openai()
    with fake as base:
        env = {"OLLAMA_HOST": base} if provider == "ollama" else {"OPENAI_BASE_URL": base, "OPENAI_API_KEY": "sk-x"}
        for name, value in env.items():  # this process checks the model when the collection is made
            setattr(settings, name, value)
        worker = start_worker(tmp_path, extra_env=env)
        try:
            collection = collection_create(name="remote", embedding_provider=provider, embedding_model="fake-embed")
            document = document_create_from_text(collection=collection, source_uri="note://r", text=LONG_TEXT).document
            wait_until_status(document, DocumentStatus.READY, worker)
        finally:
            worker.stop()
    collection.embedding_model.refresh_from_db()
    assert collection.embedding_model.dimensions == DIMENSIONS
    assert vectors_per_chunk(document, collection.embedding_model_id) == [1] * document.chunk_count
    with connection.cursor() as cursor:  # the model got its own HNSW index when its dimension was learnt
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s",
            [f"kb_embedding_hnsw_model_{collection.embedding_model_id}"],
        )
        assert f"vector({DIMENSIONS})" in cursor.fetchone()[0]


def test_a_document_failed_readably_by_a_dead_backend_recovers_on_retry(tmp_path, settings):
    port = free_port()
    env = {"OLLAMA_HOST": f"http://127.0.0.1:{port}", "EMBEDDING_MAX_RETRIES": "1", "EMBEDDING_TIMEOUT_SECONDS": "2"}
    worker = start_worker(tmp_path, extra_env=env)
    try:
        collection = remote_collection(settings, name="remote", model="fake-embed")
        document = document_create_from_text(
            collection=collection, source_uri="note://d", text="Some text to embed."
        ).document
        wait_until_status(document, DocumentStatus.FAILED, worker, timeout=120)
        assert document.error_code == "EMBEDDING_ERROR"
        assert f"127.0.0.1:{port} is unreachable" in document.error
        assert Chunk.objects.filter(document=document).count() == document.chunk_count  # nothing half-written
        assert not Embedding.objects.filter(chunk__document=document).exists()
        with fake_ollama(port=port):
            document_mark_pending(doc_id=document.pk)
            wait_until_status(document, DocumentStatus.READY, worker)
        assert document.error == ""
    finally:
        worker.stop()


def test_changing_the_model_re_embeds_in_the_background_then_switches(tmp_path, settings):
    with fake_ollama() as base:
        settings.OLLAMA_HOST = base
        worker = start_worker(tmp_path, extra_env={"OLLAMA_HOST": base})
        try:
            collection = collection_create(name="switch")
            document = document_create_from_text(collection=collection, source_uri="note://s", text=LONG_TEXT).document
            wait_until_status(document, DocumentStatus.READY, worker)
            old_model_id = collection.embedding_model_id
            collection = collection_switch_model(collection=collection, provider="ollama", model_name="fake-embed")
            # Until the new vectors are complete, search keeps the old model.
            assert collection.embedding_model_id == old_model_id and collection.next_embedding_model is not None
            new_model_id = collection.next_embedding_model_id
            wait_for(
                lambda: Collection.objects.get(pk=collection.pk).embedding_model_id == new_model_id,
                timeout=120,
                what="the collection to switch models",
            )
        finally:
            worker.stop()
    assert Collection.objects.get(pk=collection.pk).next_embedding_model is None
    assert vectors_per_chunk(document, new_model_id) == [1] * document.chunk_count
    assert vectors_per_chunk(document, old_model_id) == []  # of no use to it, and in the old model's index
    document.refresh_from_db()
    assert (document.status, document.embedded_count) == (DocumentStatus.READY, document.chunk_count)


def test_a_re_embed_stopped_with_its_reason_is_finished_by_a_retry(tmp_path, settings):
    port = free_port()
    worker = start_worker(tmp_path, extra_env={"OLLAMA_HOST": f"http://127.0.0.1:{port}"})
    try:
        collection = collection_create(name="switch")
        document = document_create_from_text(collection=collection, source_uri="note://s", text=LONG_TEXT).document
        wait_until_status(document, DocumentStatus.READY, worker)
        with fake_ollama() as base:  # the model answered when it was chosen...
            settings.OLLAMA_HOST = base
            collection = collection_switch_model(collection=collection, provider="ollama", model_name="fake-embed")
        with fake_ollama(port=port, models=()):  # ...and was removed from the server before the worker came
            wait_for(lambda: reembedding_of(collection).state == "stopped", timeout=60, what="the re-embed to stop")
        stopped = reembedding_of(collection)
        assert "ollama pull fake-embed" in stopped.error and stopped.done == 0 and stopped.total == document.chunk_count
        assert Collection.objects.get(pk=collection.pk).embedding_model.name == "all-MiniLM-L6-v2"  # search goes on
        with fake_ollama(port=port):
            out = io.StringIO()
            call_command("kb_reembed", "--collection", "switch", "--retry", "--wait", stdout=out, stderr=io.StringIO())
        assert "Done: switch now searches with ollama:fake-embed" in out.getvalue()
    finally:
        worker.stop()
    switched = Collection.objects.get(pk=collection.pk)
    assert (switched.next_embedding_model, switched.reembed_error, switched.reembed_stopped_at) == (None, "", None)
    assert vectors_per_chunk(document, switched.embedding_model_id) == [1] * document.chunk_count


def reembedding_of(collection: Collection):
    return collection_reembedding(collection=Collection.objects.get(pk=collection.pk))


def test_a_worker_s_heartbeat_with_its_queues_lasts_while_it_runs(tmp_path, client):
    worker = start_worker(tmp_path, name="beating", queues="interactive")
    try:
        wait_for(
            lambda: WorkerHeartbeat.objects.filter(hostname__startswith="beating-").exists(),
            timeout=60,
            what="the worker's first heartbeat",
        )
        beat = WorkerHeartbeat.objects.get(hostname__startswith="beating-")
        assert beat.queues == ["interactive"]
        wait_for(
            lambda: WorkerHeartbeat.objects.get(pk=beat.pk).last_seen_at > beat.last_seen_at,
            timeout=30,
            what="the heartbeat to be renewed",
        )
        worker_check = client.get("/api/health").json()["checks"]["worker"]
        assert worker_check["queues"] == {"celery": 0, "interactive": 1, "sync": 0}
    finally:
        worker.stop()
    assert not WorkerHeartbeat.objects.filter(pk=beat.pk).exists()


def test_a_switch_of_models_while_a_document_embeds_leaves_it_with_the_new_model_s_vectors(settings):
    """A worker that had loaded the collection before the switch embedded chunks written after it
    with the old model and marked the document ready: no semantic search found them."""
    collection = remote_collection(settings, name="switching", model="old-model")
    document = document_create_from_text(collection=collection, source_uri="note://d", text=LONG_TEXT).document
    switched = []

    def old_model(handler, body):
        if not switched:  # while the worker waits for its first batch: the switch, then a new version
            switched.append(True)
            moved = collection_switch_model(collection=collection, provider="openai", model_name="new-model")
            while not collection_reembed_step(collection_id=moved.pk):
                pass
            document_create_from_text(collection=moved, source_uri="note://d", text=LONG_TEXT + "\n\nA new ending.")
            connection.close()  # this server thread's
        return _ollama_embed(handler, body)

    with serve({"/api/embed": old_model}) as ollama, fake_openai() as openai:
        settings.OLLAMA_HOST, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = ollama, openai, "sk-x"
        assert document_claim(doc_id=document.pk)
        assert document_embed(doc_id=document.pk) == DocumentStatus.READY
    assert switched
    document.refresh_from_db()
    new_model = Collection.objects.get(pk=collection.pk).embedding_model
    assert new_model.name == "new-model"
    assert vectors_per_chunk(document, new_model.pk) == [1] * document.chunk_count
    assert document.embedded_count == document.chunk_count and "A new ending." in document.raw_content
    assert Embedding.objects.filter(chunk__document=document).exclude(model=new_model).count() == 0


def test_vectors_a_re_embed_step_writes_as_its_switch_is_cancelled_are_deleted(settings, monkeypatch):
    """The step had read the collection before the cancel, which deleted the next model's vectors;
    the batch it then stored would have stayed in that model's index for good."""
    monkeypatch.setattr(embedding_pipeline, "PRUNE_BATCH_SIZE", 3)  # a batch of vectors takes several statements
    collection = remote_collection(settings, name="cancelled", model="old-model")
    document_create_from_text(collection=collection, source_uri="note://c", text=LONG_TEXT)
    Document.objects.filter(collection=collection).update(status=DocumentStatus.READY)  # as if embedded
    old_model_id = collection.embedding_model_id

    def cancelled_meanwhile(handler, body):
        collection_reembed_cancel(collection=collection)
        connection.close()  # this server thread's
        return _openai_embeddings(handler, body)

    with fake_openai() as openai:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = openai, "sk-x"
        collection = collection_switch_model(collection=collection, provider="openai", model_name="next-model")
    next_model_id = collection.next_embedding_model_id
    with serve({"/v1/embeddings": cancelled_meanwhile}) as openai:
        settings.OPENAI_BASE_URL = f"{openai}/v1"
        assert collection_reembed_step(collection_id=collection.pk) is False  # stored a batch after the cancel
        assert Embedding.objects.filter(collection_id=collection.pk, model_id=next_model_id).count() > 3
        assert collection_reembed_step(collection_id=collection.pk) is True
    assert Embedding.objects.filter(collection_id=collection.pk, model_id=next_model_id).count() == 0
    assert Collection.objects.get(pk=collection.pk).embedding_model_id == old_model_id


def test_a_switch_finishes_without_the_documents_a_worker_is_still_to_embed(settings):
    """Steady writes keep adding documents that wait for a worker; counted among what a switch
    had to re-embed first, they kept it from ever finishing (0 of 2 switches at 35 writes/s in
    90 s). Their own worker embeds them with the new model once the switch is made."""
    collection, _, model_b = collection_with_vectors_of_two_models(settings)
    Document.objects.filter(collection=collection).update(status=DocumentStatus.READY)
    waiting = document_create_from_text(collection=collection, source_uri="note://new", text="Drag at Mach 2.")
    assert collection_reembed_step(collection_id=collection.pk) is True
    assert Collection.objects.get(pk=collection.pk).embedding_model_id == model_b
    with fake_openai() as openai:
        settings.OPENAI_BASE_URL = openai
        assert document_claim(doc_id=waiting.document.pk)
        assert document_embed(doc_id=waiting.document.pk) == DocumentStatus.READY
    vectors = Embedding.objects.filter(chunk__document=waiting.document).values_list("model_id", flat=True)
    assert sorted(vectors) == [model_b] * waiting.document.chunk_count


def collection_with_vectors_of_two_models(settings) -> tuple[Collection, int, int]:
    """A collection on model A, switching to model B, with every chunk's vector of both."""
    collection = remote_collection(settings, name="two-models", model="model-a")
    document_create_from_text(collection=collection, source_uri="note://t", text=LONG_TEXT)
    with fake_openai() as openai:
        settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = openai, "sk-x"
        collection = collection_switch_model(collection=collection, provider="openai", model_name="model-b")
    chunks = list(Chunk.objects.filter(collection=collection).values_list("id", "content"))
    for model in (collection.embedding_model, collection.next_embedding_model):
        insert_vectors(model, [pk for pk, _ in chunks], [fake_vector(text) for _, text in chunks])
    return collection, collection.embedding_model_id, collection.next_embedding_model_id


def vectors_of(collection: Collection, model_id: int) -> int:
    return Embedding.objects.filter(collection_id=collection.pk, model_id=model_id).count()


@contextlib.contextmanager
def another_transaction_holding(change: Callable[[], object]) -> Iterator[threading.Event]:
    """While the block runs, another connection has made ``change`` and commits it a second later;
    the event is set once it has committed."""
    started, committed = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                change()
                started.set()
                time.sleep(1)  # the block starts meanwhile
        finally:
            committed.set()
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert started.wait(10)
    try:
        yield committed
    finally:
        thread.join()


def test_cancelling_a_switch_deletes_the_next_model_s_vectors_at_once(settings):
    collection, model_a, model_b = collection_with_vectors_of_two_models(settings)
    chunk_count = Chunk.objects.filter(collection=collection).count()
    assert vectors_of(collection, model_b) == chunk_count > 0
    collection_reembed_cancel(collection=collection)
    assert (vectors_of(collection, model_a), vectors_of(collection, model_b)) == (chunk_count, 0)


def test_a_prune_waits_for_a_switch_back_to_the_model_it_prunes(settings):
    """A switch A -> B had finished and its prune of A's vectors began as a curator switched back
    to A: the switch found A's vectors complete (the prune had not committed) and its prune then
    deleted them, leaving the collection searching with a model of which it had no vectors."""
    collection, model_a, model_b = collection_with_vectors_of_two_models(settings)
    chunk_count = Chunk.objects.filter(collection=collection).count()
    Collection.objects.filter(pk=collection.pk).update(embedding_model_id=model_b, next_embedding_model=None)

    def switch_back() -> None:  # as collection_reembed_step completes a switch: the row locked first
        collection_lock(collection=collection)
        Collection.objects.filter(pk=collection.pk).update(embedding_model_id=model_a)

    with another_transaction_holding(switch_back) as switched_back:
        deleted = vectors_prune(collection_id=collection.pk)
        assert switched_back.is_set()  # the prune waited for the switch
    assert (vectors_of(collection, model_a), vectors_of(collection, model_b)) == (chunk_count, 0)
    assert deleted == chunk_count


def test_a_re_embed_batch_never_deadlocks_with_a_writer_deleting_its_chunks_in_another_order(settings):
    """A re-embed batch share-locked its chunks one by one in the batch's order and waited for any
    a writer was deleting; a writer deleting the same chunks in another order then waited for it:
    deadlock (SQLSTATE 40P01), which failed the write or the switch's step."""
    collection = remote_collection(settings, name="reordered", model="model-a")
    document_create_from_text(collection=collection, source_uri="note://r", text=LONG_TEXT)
    first, second = Chunk.objects.filter(collection=collection).order_by("id").values_list("id", "content")[:2]
    second_deleted, batch_stored = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def delete_second_then_first() -> None:
        try:
            with transaction.atomic():
                Chunk.objects.filter(pk=second[0]).delete()
                second_deleted.set()
                batch_stored.wait(timeout=3)  # waited for in vain before: the batch waited for this
                Chunk.objects.filter(pk=first[0]).delete()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    writer = threading.Thread(target=delete_second_then_first)
    writer.start()
    assert second_deleted.wait(timeout=30)
    try:
        insert_vectors(
            collection.embedding_model, [first[0], second[0]], [fake_vector(first[1]), fake_vector(second[1])],
            skip_locked=True,
        )  # fmt: skip
        batch_stored.set()
    finally:
        writer.join(timeout=60)
    assert errors == []
    assert not Chunk.objects.filter(pk__in=[first[0], second[0]]).exists()
    assert not Embedding.objects.filter(chunk_id__in=[first[0], second[0]]).exists()


def test_vectors_of_a_chunk_deleted_as_they_are_stored_are_skipped_not_a_key_error(settings):
    """A chunk the batch had read was deleted (its document updated) and committed during the
    insert: the foreign key's check failed the whole batch, and a switch under updates had gone
    to "retrying", then "stopped", on that database error."""
    collection = remote_collection(settings, name="updated", model="model-a")
    document_create_from_text(collection=collection, source_uri="note://u", text=LONG_TEXT)
    gone, kept = Chunk.objects.filter(collection=collection).order_by("id").values_list("id", "content")[:2]
    with another_transaction_holding(lambda: Chunk.objects.filter(pk=gone[0]).delete()) as deleted:
        insert_vectors(collection.embedding_model, [gone[0], kept[0]], [fake_vector(gone[1]), fake_vector(kept[1])])
        assert deleted.is_set()  # the insert waited for the deletion
    assert list(Embedding.objects.filter(collection_id=collection.pk).values_list("chunk_id", flat=True)) == [kept[0]]
