"""Broker outage (issue 18, item 6): documents written while the broker is down are enqueued within
30 s of its return.

A real Redis of this test's own (no persistence: what it held dies with it), a real ASGI host and a
real Celery worker on it, a fake Ollama (a remote service, hence faked) as the embedder. Redis is
killed, documents are written over the REST API (each answers at once: the write never waits for
the broker), Redis comes back on the same port, and every one of them must leave ``pending``
within 30 s and end ready with one vector per chunk.
"""

import base64
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.db.models import Count
from django.utils import timezone

from kb.models import Chunk, Collection, Document, DocumentStatus, Embedding
from kb.services.collections import collection_create
from tests.conftest import ChildProcess, free_port, start_worker, wait_for
from tests.support.mcp_server import FAKE_MODEL, fake_embedder, listening, uvicorn_server

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REDIS_SERVER = Path("/usr/bin/redis-server")
COLLECTION = "outage"
WRITTEN_DURING_OUTAGE = 5
INGEST_CALL_LIMIT = 5.0  # seconds a write may take while the broker is down
OUTAGE_SECONDS = 15.0  # how long Redis stays down after the writes
CATCH_UP_DEADLINE = 30.0  # the requirement: enqueued (no longer pending) within 30 s of the broker's return
EMBEDDING_SLACK = 15.0  # once enqueued, embedding a short note takes well under a second: fixed slack


class RedisServer:
    """A redis-server without persistence on a fixed loopback port, which can be killed and started again."""

    def __init__(self, log_dir: Path, port: int) -> None:
        self.log_dir, self.port = log_dir, port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.started = 0
        self.process: ChildProcess | None = None

    def start(self) -> None:
        self.started += 1
        command = [
            str(REDIS_SERVER), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.log_dir),
        ]  # fmt: skip
        self.process = ChildProcess(command, dict(os.environ), self.log_dir / f"redis-{self.started}.log")
        process = self.process
        wait_for(lambda: listening(self.port) or not process.alive(), timeout=20, what="redis-server to listen")
        assert process.alive(), process.log()

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, connections drop as in a crash."""
        assert self.process is not None
        self.process.kill()
        self.process.stop()  # reaps it and closes its log
        assert not listening(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if not REDIS_SERVER.exists():
        message = (
            f"{REDIS_SERVER} is missing: this test starts (and kills) a Redis of its own (apt install redis-server)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = RedisServer(tmp_path, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Deployment:
    url: str
    worker: ChildProcess
    server_log: Path

    def logs(self) -> str:
        server = self.server_log.read_text(errors="replace") if self.server_log.exists() else ""
        return f"--- worker log ---\n{self.worker.log()[-6000:]}\n--- uvicorn log ---\n{server[-3000:]}"


@pytest.fixture
def deployment(tmp_path: Path, redis: RedisServer, settings, transactional_db: None) -> Iterator[Deployment]:
    """The ASGI host and a worker on every queue, both on this test's Redis, embedding with a fake Ollama."""
    with fake_embedder() as embedder:
        settings.OLLAMA_HOST = embedder["OLLAMA_HOST"]  # this process checks the model once, below
        collection_create(name=COLLECTION, embedding_provider="ollama", embedding_model=FAKE_MODEL)
        env = {**embedder, "CELERY_BROKER_URL": redis.url, "KB_WRITE_WAIT_SECONDS": "0"}
        worker = start_worker(tmp_path, extra_env=env, name="outage-worker")
        try:
            with uvicorn_server(tmp_path, env) as url:
                yield Deployment(url=url, worker=worker, server_log=_uvicorn_log(tmp_path))
        finally:
            worker.stop()


def _uvicorn_log(log_dir: Path) -> Path:
    logs = sorted(log_dir.glob("uvicorn-*.log"))
    assert len(logs) == 1, logs
    return logs[0]


def ingest(client: httpx.Client, text: str) -> tuple[str, float]:
    """Write a note over the REST API: its document id and how long the call took."""
    uri = "data:text/plain;base64," + base64.b64encode(text.encode()).decode()
    began = time.monotonic()
    response = client.post(f"/api/collections/{COLLECTION}/documents", json={"uri": uri})
    took = time.monotonic() - began
    assert response.status_code == 200, response.text
    (item,) = response.json()["items"]
    assert (item["outcome"], item["status"]) == ("created", DocumentStatus.PENDING), item
    return item["doc_id"], took


def statuses(ids: list[str]) -> dict[str, str]:
    return dict(Document.objects.filter(pk__in=ids).values_list("id", "status"))


def note(n: int) -> str:
    return f"Field note {n}: the weather station on ridge {n} logged {n * 7} millimetres of rain overnight."


def test_documents_written_while_the_broker_is_down_are_enqueued_within_30_s_of_its_return(
    deployment: Deployment, redis: RedisServer
):
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        baseline, _ = ingest(client, note(0))
        try:
            wait_for(lambda: statuses([baseline])[baseline] == DocumentStatus.READY, timeout=60, what="the baseline")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {statuses([baseline])}\n{deployment.logs()}") from None

        redis.kill()
        written: list[str] = []
        call_times: list[float] = []
        for n in range(1, WRITTEN_DURING_OUTAGE + 1):
            doc_id, took = ingest(client, note(n))
            written.append(doc_id)
            call_times.append(took)
    print(f"\nwrites while the broker was down answered in {', '.join(f'{took:.2f}' for took in call_times)} s")

    time.sleep(OUTAGE_SECONDS)
    assert set(statuses(written).values()) == {DocumentStatus.PENDING}, "embedded with no broker?"

    back = time.monotonic()
    redis.start()  # the same port: the worker and the web server reconnect to the address they know
    left_pending, ready = catch_up(written, since=back)
    for n, doc_id in enumerate(written, start=1):
        print(
            f"note {n}: left pending {_seconds(left_pending.get(doc_id))}, "
            f"ready {_seconds(ready.get(doc_id))} after the broker came back"
        )

    late = [doc_id for doc_id in written if left_pending.get(doc_id, float("inf")) > CATCH_UP_DEADLINE]
    assert not late, (
        f"{len(late)} of {len(written)} documents written during the outage were still pending "
        f"{CATCH_UP_DEADLINE:.0f} s after the broker came back (requeue deadlines: {requeue_in(late)}; "
        f"writes answered in {call_times} s)\n{deployment.logs()}"
    )
    assert len(ready) == len(written), f"enqueued but not embedded: {statuses(written)}\n{deployment.logs()}"
    assert max(call_times) < INGEST_CALL_LIMIT, f"a write waited for the broker: {call_times} s\n{deployment.logs()}"

    collection = Collection.objects.get(name=COLLECTION)
    documents = Document.objects.filter(collection=collection)
    assert sorted(documents.values_list("id", flat=True)) == sorted([baseline, *written])  # no duplicate documents
    for document in documents:
        assert (document.status, document.embedded_count) == (DocumentStatus.READY, document.chunk_count), document
        assert Chunk.objects.filter(document=document).count() == document.chunk_count > 0
        per_chunk = (
            Embedding.objects.filter(chunk__document=document, model_id=collection.embedding_model_id)
            .values("chunk_id")
            .annotate(n=Count("id"))
            .values_list("n", flat=True)
        )
        assert sorted(per_chunk) == [1] * document.chunk_count, f"{document.pk}: vectors per chunk {list(per_chunk)}"
    assert (
        not Embedding.objects.filter(chunk__document__collection=collection)
        .exclude(model_id=collection.embedding_model_id)
        .exists()
    )


def catch_up(ids: list[str], *, since: float) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds after ``since`` at which each document was first seen out of pending, and ready.
    Waits until all are ready, at most CATCH_UP_DEADLINE for them to leave pending plus
    EMBEDDING_SLACK for their embedding."""
    left_pending: dict[str, float] = {}
    ready: dict[str, float] = {}
    while len(ready) < len(ids):
        elapsed = time.monotonic() - since
        for doc_id, status in statuses(ids).items():
            if status != DocumentStatus.PENDING:
                left_pending.setdefault(doc_id, elapsed)
            if status == DocumentStatus.READY:
                ready.setdefault(doc_id, elapsed)
        still_pending = len(left_pending) < len(ids)
        if elapsed > CATCH_UP_DEADLINE + EMBEDDING_SLACK or (still_pending and elapsed > CATCH_UP_DEADLINE):
            break
        time.sleep(0.1)
    return left_pending, ready


def requeue_in(ids: list[str]) -> dict[str, str]:
    """When the sweep would send each document again."""
    now = timezone.now()
    leases = Document.objects.filter(pk__in=ids).values_list("id", "lease_expires_at")
    return {
        doc_id: "next sweep" if lease is None else f"in {(lease - now).total_seconds():.0f} s"
        for doc_id, lease in leases
    }


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"
