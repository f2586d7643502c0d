"""The default broker (kb/file_broker.py): a consumer never gets a message that is still being
written (kombu #1551: under 50 MCP clients a worker read an empty message file and stopped the
whole system), no message is lost while a routing table is written, and an idle worker's wait for
messages ends once it is asked to stop."""

import json
import subprocess
import sys
import threading
import time
import uuid
from contextlib import suppress
from pathlib import Path

import pytest
from celery.worker import state as worker_state
from django.conf import settings
from kombu import Connection

from config.celery import app
from kb.file_broker import Transport


def _options(folder: Path) -> dict[str, str]:
    """Messages in folder/queue; kombu's control folder defaults to ./control."""
    return {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "control_folder": str(folder / "control"),
    }


def _connection(folder: Path) -> Connection:
    (folder / "queue").mkdir(parents=True, exist_ok=True)
    return Connection(
        "filesystem://",
        transport_options={**_options(folder), "polling_interval": 0.001},
    )


def test_the_default_broker_url_means_this_transport_and_others_keep_theirs(tmp_path: Path) -> None:
    assert settings.CELERY_BROKER_URL == "filesystem://"
    assert type(_connection(tmp_path).transport) is Transport
    assert type(app.connection_for_write().transport) is Transport
    assert app.connection_for_write(url="redis://127.0.0.1:1/0").transport.driver_type == "redis"


# A producer in its own process (the web, or a worker retrying): one that holds the GIL while it
# serialises could not be raced by a thread.
PRODUCER = """
import json, sys
from kombu import Connection
options = json.loads(sys.argv[1])
import config.celery  # registers the transport, as every process of ours does
payload = {"rows": [[index, "x" * 20] for index in range(1_500_000)]}
with Connection("filesystem://", transport_options=options) as connection:
    connection.SimpleQueue("q").put(payload, serializer="json")
"""


def test_a_consumer_polling_while_a_large_message_is_written_gets_it_whole(tmp_path: Path) -> None:
    # Serialising this takes about a second; kombu's own transport has the file under its final
    # name, empty, all that time.
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, json.dumps(_options(tmp_path))],
        cwd=settings.BASE_DIR,
    )
    message = None
    try:
        with _connection(tmp_path) as connection:
            queue = connection.SimpleQueue("q")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with suppress(queue.Empty):
                    message = queue.get(timeout=0.01)
                    message.ack()
                    break
        assert producer.wait(timeout=60) == 0
    finally:
        producer.kill()
    assert message is not None, "no message in 60 s"
    assert len(message.payload["rows"]) == 1_500_000
    assert [path.name for path in (tmp_path / "queue").iterdir()] == []


def test_messages_of_producers_starting_together_on_a_fresh_folder_all_arrive_once(tmp_path: Path) -> None:
    # Each producer declares the queue, which creates its exchange table when missing: kombu
    # empties it before locking it, and another producer's message found no queue (or its table
    # no JSON) and was lost.
    count, producers = 200, 4
    # Kombu keeps bindings per process, whatever the folder: a queue name no earlier test declared.
    name = f"fresh-{uuid.uuid4().hex}"
    errors: list[Exception] = []
    together = threading.Barrier(producers)

    def produce(offset: int) -> None:
        try:
            with _connection(tmp_path) as connection:
                together.wait(timeout=30)
                queue = connection.SimpleQueue(name)
                for index in range(offset, count, producers):
                    queue.put({"n": index}, serializer="json")
        except Exception as error:  # noqa: BLE001 - the failure under test
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(offset,)) for offset in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with _connection(tmp_path) as connection:
        queue = connection.SimpleQueue(name)
        messages = [queue.get(timeout=1) for _ in range(count)]
        for message in messages:
            message.ack()
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)
    assert sorted(message.payload["n"] for message in messages) == list(range(count))


# Processes of ours (web, workers) declaring a queue at the same moment on a fresh var/celery.
DECLARER = """
import json, sys, time
import config.celery  # registers the transport, as every process of ours does
from kombu import Connection
options, start = json.loads(sys.argv[1]), float(sys.argv[2])
with Connection("filesystem://", transport_options=options) as connection:
    while time.time() < start:
        pass
    connection.SimpleQueue("q").put({"from": "a process"}, serializer="json")
"""


def test_processes_declaring_a_queue_together_on_a_fresh_folder_lose_nothing(tmp_path: Path) -> None:
    # Kombu creates a missing routing table by opening it for writing, which empties it before
    # taking its lock: a process reading it then failed (JSONDecodeError) or found no queue.
    # A script saw 10 processes fail over 15 rounds of 8; with kombu's own table creation
    # this test failed in 1 of 3 runs here: a guard that catches the race often, not always.
    for round_number in range(8):
        folder = tmp_path / f"round-{round_number}"
        (folder / "queue").mkdir(parents=True)
        start = time.time() + 1.5
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", DECLARER, json.dumps(_options(folder)), str(start)],
                cwd=settings.BASE_DIR,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        outcomes = [(process.wait(timeout=60), process.stderr.read()) for process in processes]
        failures = [error[-2000:] for status, error in outcomes if status != 0]
        assert failures == [], failures[0]
        assert len([path for path in (folder / "queue").iterdir() if path.name.endswith(".q.msg")]) == 8


def test_an_idle_worker_stops_waiting_for_messages_once_asked_to_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery waits in drain_events between its looks at a stop request (2 s each time): the wait
    # must end at the next poll once its warm-stop handler has set should_stop.
    monkeypatch.setattr(worker_state, "should_stop", None)
    ended: list[float] = []

    def wait_for_a_message() -> None:
        with _connection(tmp_path) as connection:
            connection.SimpleQueue("q")  # declares it, so there is something to drain
            started = time.monotonic()
            with suppress(TimeoutError):
                connection.drain_events(timeout=30)
            ended.append(time.monotonic() - started)

    waiter = threading.Thread(target=wait_for_a_message)
    waiter.start()
    time.sleep(0.3)
    worker_state.should_stop = 0  # what Celery's warm-stop handler sets (the exit code)
    waiter.join(timeout=40)
    assert len(ended) == 1
    assert ended[0] < 10, f"drain_events went on for {ended[0]:.1f} s after the stop request"
