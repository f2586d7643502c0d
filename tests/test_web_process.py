"""How the web process (config.asgi) sets itself up for many callers at once, against a process
that only loads the settings (workers, commands)."""

import os
import subprocess
import sys

import httpx
from django.db import connection

from kb.embedding_providers import onnx_threads, usable_cores
from tests.conftest import ROOT, wait_for


def printed_after(importing: str, expression: str, **env: str) -> str:
    """What ``expression`` prints in a fresh interpreter that imported ``importing`` (Django set up)."""
    code = f"import {importing}, django; django.setup(); import gc, kb.embedding_providers as e; print({expression})"
    clean = {key: value for key, value in os.environ.items() if key != "KB_ONNX_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_the_web_process_runs_the_model_on_one_thread_unless_told_otherwise(settings):
    assert printed_after("config.asgi", "e.onnx_threads()") == "1"
    assert printed_after("config.asgi", "e.onnx_threads()", KB_ONNX_THREADS="3") == "3"
    workers = printed_after("config.settings", "e.onnx_threads()", DJANGO_SETTINGS_MODULE="config.settings")
    assert workers == str(min(usable_cores(), 4))
    settings.KB_ONNX_THREADS = 2
    assert onnx_threads() == 2


def test_the_web_process_keeps_what_it_loaded_out_of_the_cyclic_collector():
    frozen, threshold = printed_after("config.asgi", "gc.get_freeze_count(), gc.get_threshold()[0]").split()
    assert int(frozen) > 10_000  # Django, the MCP servers and their schemas
    assert int(threshold) == 20_000
    assert printed_after("config.settings", "gc.get_freeze_count(), gc.get_threshold()[0]") == "0 700"


def test_a_request_to_django_closes_its_database_connection_as_it_finishes(live_server_url):
    """Each request runs in a thread of its own: a connection left open would wait for the
    collector, and enough requests between two collections exhaust Postgres' connections. The
    backend of a closed connection leaves pg_stat_activity a moment later (under load, after the check)."""
    with httpx.Client(base_url=live_server_url, timeout=30) as client:
        for _ in range(40):
            assert client.get("/api/collections").status_code == 200
    wait_for(lambda: _other_clients() == 0, timeout=10, what="the requests' connections to close")


def _other_clients() -> int:
    """Client connections to the test database other than this test's own (autovacuum's are not)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_django_runs_at_most_kb_web_max_requests_views_at_once(settings, monkeypatch, transactional_db):
    """Unbounded, 110 concurrent REST searches had opened more connections than Postgres allows."""
    import asyncio

    from django.core.handlers.asgi import ASGIHandler

    from config.asgi import TurnTakingHandler

    settings.KB_WEB_MAX_REQUESTS = 2
    running, most = 0, 0
    respond = ASGIHandler.run_get_response

    async def counted(self, request):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        try:
            return await respond(self, request)
        finally:
            running -= 1

    monkeypatch.setattr(ASGIHandler, "run_get_response", counted)

    async def twelve_at_once(path: str) -> list[int]:
        transport = httpx.ASGITransport(app=TurnTakingHandler())
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            responses = await asyncio.gather(*(client.get(path) for _ in range(12)))
        return [response.status_code for response in responses]

    assert asyncio.run(twelve_at_once("/api/collections")) == [200] * 12
    assert most == 2
    most = 0
    assert asyncio.run(twelve_at_once("/health/live")) == [200] * 12  # liveness never waits its turn
    assert most == 12
