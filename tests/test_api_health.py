"""Health: database, broker and every embedding provider in use, on /api/health and /health."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from config.celery import app
from kb.models import WorkerHeartbeat
from kb.selectors.health import broker_check, readiness
from kb.services.workers import worker_beat, worker_gone
from tests.conftest import free_port
from tests.support.fake_providers import remote_collection
from tests.support.http_server import serve

pytestmark = pytest.mark.django_db


def ollama_tags(*names: str):
    payload = json.dumps({"models": [{"name": name} for name in names]}).encode()
    return lambda handler, body: (200, {"content-type": "application/json"}, payload)


def test_it_reports_the_state_of_each_dependency(client, live_worker):
    response = client.get("/api/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["pgvector"].startswith("0.8")
    assert body["checks"]["broker"] == {"ok": True, "transport": "filesystem"}
    assert body["checks"]["embedding"]["models"]["local:all-MiniLM-L6-v2"]["ok"] is True
    assert client.get("/health").json() == body


def test_it_needs_no_token_even_when_tokens_are_required(client, settings):
    settings.KB_REQUIRE_AUTH = True
    assert client.get("/api/health").status_code == 200


def test_an_ollama_model_in_use_is_checked_on_the_ollama_server(client, settings, live_worker):
    remote_collection(settings, name="remote")
    with serve({"/api/tags": ollama_tags("nomic-embed-text:latest")}) as base:
        settings.OLLAMA_HOST = base
        body = client.get("/api/health").json()
    assert body["status"] == "ok"
    assert body["checks"]["embedding"]["models"]["ollama:nomic-embed-text"] == {"ok": True, "host": base}


def test_a_model_ollama_has_not_pulled_is_named(client, settings):
    remote_collection(settings, name="remote")
    with serve({"/api/tags": ollama_tags("llama3:latest")}) as base:
        settings.OLLAMA_HOST = base
        response = client.get("/api/health")
    assert (response.status_code, response.json()["status"]) == (200, "degraded")
    assert (
        "ollama pull nomic-embed-text"
        in response.json()["checks"]["embedding"]["models"]["ollama:nomic-embed-text"]["error"]
    )


def test_an_unreachable_provider_degrades_the_service_without_failing_it(client, settings):
    """Search, ingestion and the other collections still work: a load balancer must keep it."""
    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    remote_collection(settings, name="remote")
    response = client.get("/api/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"]["ok"] is True
    assert "unreachable" in body["checks"]["embedding"]["models"]["ollama:nomic-embed-text"]["error"]


def test_an_openai_compatible_server_is_checked_by_listing_its_models(client, settings):
    remote_collection(settings, name="remote", provider="openai")
    models = json.dumps({"object": "list", "data": []}).encode()
    with serve({"/v1/models": lambda handler, body: (200, {"content-type": "application/json"}, models)}) as base:
        settings.OPENAI_BASE_URL = f"{base}/v1"
        assert client.get("/api/health").json()["checks"]["embedding"]["ok"] is True
    settings.OPENAI_BASE_URL = f"http://127.0.0.1:{free_port()}/v1"
    assert client.get("/api/health").json()["checks"]["embedding"]["ok"] is False


def test_an_unreachable_broker_is_reported_without_retrying_for_long():
    check = broker_check(url=f"redis://127.0.0.1:{free_port()}/0")
    assert check["ok"] is False
    assert "Error" in check["error"]


def test_the_file_system_broker_needs_writable_folders(tmp_path):
    options = dict(app.conf.broker_transport_options)
    assert broker_check()["ok"] is True
    app.conf.broker_transport_options = {**options, "control_folder": str(tmp_path / "missing")}
    try:
        check = broker_check()
    finally:
        app.conf.broker_transport_options = options
    assert check == {"ok": False, "transport": "filesystem", "error": f"not writable: {tmp_path / 'missing'}"}


@pytest.mark.parametrize(
    ("database", "broker", "worker", "embedding", "status"),
    [
        (True, True, True, True, "ok"),
        (True, True, True, False, "degraded"),
        (True, True, False, True, "degraded"),
        (False, True, True, True, "error"),
        (True, False, True, False, "error"),
    ],
)
def test_only_a_missing_database_or_broker_makes_the_server_unready(database, broker, worker, embedding, status):
    checks = {
        "database": {"ok": database}, "broker": {"ok": broker}, "worker": {"ok": worker}, "embedding": {"ok": embedding}
    }  # fmt: skip
    assert readiness(checks) == status


def test_without_a_worker_on_every_queue_the_server_is_degraded_not_ready(client, settings):
    def worker_state():
        body = client.get("/api/health").json()
        return body["status"], body["checks"]["worker"], client.get("/health/ready").status_code

    status, worker, ready = worker_state()
    assert (status, ready, worker["workers"]) == ("degraded", 503, 0)
    assert worker["error"] == "no live worker consumes celery, interactive, sync: documents wait for embedding"
    worker_beat(hostname="bulk@host", queues=["celery", "sync"])
    status, worker, ready = worker_state()
    assert (status, ready, worker["queues"]) == ("degraded", 503, {"celery": 1, "interactive": 0, "sync": 1})
    assert "consumes interactive:" in worker["error"]
    worker_beat(hostname="interactive@host", queues=["interactive"])
    assert worker_state() == (
        "ok",
        {"ok": True, "workers": 2, "queues": {"celery": 1, "interactive": 1, "sync": 1}},
        200,
    )
    # A worker that stopped beating (killed) no longer counts; one that stopped cleanly is gone.
    WorkerHeartbeat.objects.filter(hostname="bulk@host").update(
        last_seen_at=timezone.now() - timedelta(seconds=3 * settings.KB_WORKER_HEARTBEAT_SECONDS + 1)
    )
    assert worker_state()[2] == 503
    worker_gone(hostname="interactive@host")
    assert client.get("/health/ready").json() == {"status": "not ready"}
    assert client.get("/health").status_code == 200  # degraded: search and writes still work
