"""Recovery within seconds: a worker SIGKILLed mid-document is replaced on the document by another
worker once the dead one's lease runs out. The lease is renewed by a thread of the worker that holds
it (kb.leases), so it runs out only when that worker died, and it is short (KB_EMBED_LEASE_SECONDS);
the survivor's sweep (KB_SWEEP_INTERVAL_SECONDS) sends the document to it again.

KB_FAULT_TRIALS sets how many kills (3 in `make test`; README's figure is from 20).
"""

import os
import signal
import statistics
import time

import psutil
import pytest
from django.db.models import Count

from kb.models import Document, DocumentStatus, Embedding, WorkerHeartbeat
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from tests.conftest import start_worker, wait_for
from tests.support.fake_providers import fake_ollama

pytestmark = pytest.mark.django_db(transaction=True)

TRIALS = int(os.environ.get("KB_FAULT_TRIALS", "3"))
# Issue 18's target: p95 from SIGKILL to the document being worked on again.
DEADLINE_SECONDS = 15
# 150 chunks at one per 0.2 s request: the doomed worker is still busy when it is killed.
TEXT = "\n\n".join(f"Paragraph {n} says something about topic {n % 7} in plain words." for n in range(150))


# About 15 s a trial here: README's 20 trials took 310 s, past the suite's 300 s per test.
@pytest.mark.timeout(max(300, 30 * TRIALS))
def test_a_document_is_worked_on_again_within_seconds_of_its_worker_s_sigkill(tmp_path, settings):
    takeovers = []
    with fake_ollama(delay=0.2) as base:
        settings.OLLAMA_HOST = base
        collection = collection_create(
            name="recovery", embedding_provider="ollama", embedding_model="fake-embed",
            chunk_max_tokens=16, chunk_min_tokens=0,
        )  # fmt: skip
        for trial in range(TRIALS):
            takeovers.append(_kill_and_time_takeover(tmp_path, base, collection, trial))
    ordered = sorted(takeovers)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    print(
        f"\nSIGKILL -> worked on again, {TRIALS} trials: median {statistics.median(takeovers):.1f} s, "
        f"p95 {p95:.1f} s, max {max(takeovers):.1f} s ({', '.join(f'{t:.1f}' for t in takeovers)})"
    )
    assert max(takeovers) <= DEADLINE_SECONDS, takeovers


def _kill_and_time_takeover(tmp_path, base: str, collection, trial: int) -> float:
    document = document_create_from_text(collection=collection, source_uri=f"note://long-{trial}", text=TEXT).document
    assert document.chunk_count >= 100
    doomed = start_worker(tmp_path, extra_env={"OLLAMA_HOST": base, "EMBEDDING_BATCH_SIZE": "1"}, name=f"doomed{trial}")
    successor = None
    try:
        wait_for(lambda: _embedded(document) > 0, timeout=60, interval=0.05, what="the first worker to start")
        # The successor starts while the first worker embeds: it is listening when the first one dies.
        successor = start_worker(tmp_path, extra_env={"OLLAMA_HOST": base}, name=f"successor{trial}")
        wait_for(
            lambda: WorkerHeartbeat.objects.filter(hostname__startswith=f"successor{trial}-").exists(),
            timeout=60,
            what="the successor to listen",
        )
        assert _embedded(document) < document.chunk_count, "the document was done before the kill"
        attempts = Document.objects.get(pk=document.pk).embed_attempts
        doomed.kill(signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.process.wait()
        wait_for(
            lambda: Document.objects.get(pk=document.pk).embed_attempts > attempts,
            timeout=60,
            interval=0.05,
            what="another worker to take the document over",
        )
        took = time.monotonic() - killed_at
        wait_for(lambda: _status(document) == DocumentStatus.READY, timeout=60, what="the document to be ready")
    finally:
        doomed.stop()
        if successor is not None:
            successor.kill(signal.SIGKILL)
            successor.stop()
    per_chunk = Embedding.objects.filter(chunk__document=document).values("chunk").annotate(n=Count("id"))
    assert sorted(row["n"] for row in per_chunk) == [1] * document.chunk_count
    return took


def _embedded(document: Document) -> int:
    return Document.objects.get(pk=document.pk).embedded_count


def _status(document: Document) -> str:
    return Document.objects.get(pk=document.pk).status


def test_a_live_worker_keeps_its_document_through_a_provider_call_longer_than_the_lease(tmp_path, settings):
    """The lease is short, but a live worker's thread renews it: a second worker never takes over."""
    with fake_ollama(delay=settings.KB_EMBED_LEASE_SECONDS * 1.5) as base:
        settings.OLLAMA_HOST = base
        collection = collection_create(name="slow", embedding_provider="ollama", embedding_model="fake-embed")
        env = {"OLLAMA_HOST": base}
        first = start_worker(tmp_path, extra_env=env, name="first")
        second = None
        try:
            document = document_create_from_text(collection=collection, source_uri="note://slow", text="One.").document
            wait_for(lambda: _status(document) == DocumentStatus.PROCESSING, timeout=60, what="the first claim")
            second = start_worker(tmp_path, extra_env=env, name="second")
            wait_for(lambda: _status(document) == DocumentStatus.READY, timeout=90, what="the document to be ready")
        finally:
            for worker in (first, second):
                if worker is not None:
                    worker.kill(signal.SIGKILL)
                    worker.stop()
    # Claimed once: the second worker's sweeps found the lease renewed every time.
    assert Document.objects.get(pk=document.pk).embed_attempts == 1


def test_a_worker_whose_idle_pool_process_was_killed_goes_on_taking_tasks(tmp_path, settings):
    """An idle pool process waits for its next task holding the lock of the pool's task pipe
    (billiard's blocking pool, under the default file broker). SIGKILLed there, it had left its
    replacement waiting for that lock for ever: the worker held the next task and ran none."""
    with fake_ollama() as base:
        settings.OLLAMA_HOST = base
        collection = collection_create(name="idle", embedding_provider="ollama", embedding_model="fake-embed")
        worker = start_worker(tmp_path, extra_env={"OLLAMA_HOST": base}, name="idle")
        try:
            wait_for(lambda: WorkerHeartbeat.objects.exists(), timeout=60, what="the worker to listen")
            (idle,) = psutil.Process(worker.process.pid).children()
            wait_for(lambda: idle.status() == psutil.STATUS_SLEEPING, timeout=30, what="the pool process to wait")
            time.sleep(1)  # in its read of the pipe, holding the lock
            idle.kill()
            wait_for(lambda: _pool_pids(worker) - {idle.pid}, timeout=30, what="a new pool process")
            document = document_create_from_text(collection=collection, source_uri="note://next", text="Lift.").document
            wait_for(lambda: _status(document) == DocumentStatus.READY, timeout=60, what="the document to be ready")
        finally:
            worker.stop()
    assert "released" in worker.log()


def _pool_pids(worker) -> set[int]:
    return {child.pid for child in psutil.Process(worker.process.pid).children()}
