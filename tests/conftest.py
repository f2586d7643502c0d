"""Fixtures shared by the suite.

The suite runs against the embedded Postgres + pgvector of ``var/test/pgdata`` (started on
first connect by this process, stopped when it exits; see config.settings), or against
DATABASE_URL when that is set. Processes the tests start (Celery workers, uvicorn, the
launcher) get an environment that points them at the same test database.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection
from django.test import override_settings

from tests.support.fake_providers import fake_ollama, fake_openai

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env() -> dict[str, str]:
    """Environment variables that make a child process use the test database."""
    env = dict(os.environ)
    name = connection.settings_dict["NAME"]
    if os.environ.get("DATABASE_URL"):
        parts = urlsplit(os.environ["DATABASE_URL"])
        env["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
    else:
        env["KB_EMBEDDED_DATABASE"] = name
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("KB_WRITE_WAIT_SECONDS", "0")  # see answer_writes_at_once
    return env


@pytest.fixture(scope="session", autouse=True)
def empty_broker_queue() -> None:
    """Start with no message in the default broker's folder (var/test/celery): what earlier sessions
    queued with no worker to take it would come first to this session's workers, and a worker test
    would wait behind thousands of them."""
    from django.conf import settings

    if settings.CELERY_BROKER_URL == "filesystem://":
        for message in (settings.CELERY_DIR / "queue").glob("*.msg"):
            message.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def answer_writes_at_once() -> Iterator[None]:
    """Most tests run no worker: MCP writes answer at once instead of waiting to be searchable
    (KB_WRITE_WAIT_SECONDS). Tests of searchable-on-return set the wait and run a real worker."""
    with override_settings(KB_WRITE_WAIT_SECONDS=0):
        yield


@pytest.fixture
def live_worker(db: None) -> None:
    """A worker on every queue, as far as /health can tell (its heartbeat row; the real bootstep
    that writes it is tested with a real worker in test_embedding_worker)."""
    from django.conf import settings

    from kb.services.workers import worker_beat

    worker_beat(hostname="test-worker@localhost", queues=list(settings.CELERY_TASK_QUEUES))


@pytest.fixture
def remote_providers(settings: Any) -> Iterator[None]:
    """Ollama and an OpenAI-compatible server (HTTP fakes on loopback) that this process reaches:
    a collection may only be given a remote model that answers (embedding_model_choose)."""
    with fake_ollama() as ollama_base, fake_openai() as openai_base:
        settings.OLLAMA_HOST, settings.OPENAI_BASE_URL, settings.OPENAI_API_KEY = ollama_base, openai_base, "sk-x"
        yield


class ChildProcess:
    """A process started for a test, stopped with its whole process group."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, signum: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=20)
        self.kill(signal.SIGKILL)
        self.process.wait()
        self._log.close()


def wait_for(condition: Callable[[], bool], *, timeout: float, interval: float = 0.2, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def start_worker(
    tmp_path: Path, *, extra_env: dict[str, str] | None = None, name: str = "worker", queues: str | None = None
) -> ChildProcess:
    """A real Celery worker; ``queues`` as its -Q (default: every queue, as `make run`'s main worker)."""
    env = {**child_env(), **(extra_env or {})}
    command = [
        sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel=INFO", "--concurrency=1",
        "--without-gossip", "--without-mingle", f"--hostname={name}-{os.getpid()}@%h",
        *(["-Q", queues] if queues else []),
    ]  # fmt: skip
    return ChildProcess(command, env, tmp_path / f"{name}.log")


@pytest.fixture
def celery_worker(tmp_path: Path, transactional_db: None) -> Iterator[ChildProcess]:
    """A real Celery worker on the default (file-system) broker, using the test database."""
    worker = start_worker(tmp_path)
    yield worker
    worker.stop()


@pytest.fixture
def live_server_url(tmp_path: Path, transactional_db: None) -> Iterator[str]:
    """The real ASGI host (Django + MCP) under uvicorn on a free loopback port."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    server = ChildProcess(command, child_env(), tmp_path / "uvicorn.log")
    wait_for(lambda: _port_open(port) or not server.alive(), timeout=60, what="uvicorn to listen")
    assert server.alive(), server.log()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say which server-backed tests ran against what, and which were skipped for lack of one."""
    from tests.support.services import USED

    if USED:
        terminalreporter.section("service tests")
        for variable, outcome in sorted(USED.items()):
            terminalreporter.write_line(f"{variable.removeprefix('KB_TEST_').removesuffix('_URL').lower()}: {outcome}")


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A loopback port that accepts connections and never answers (a database host that
    hangs): each connection attempt waits for the connect timeout."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()
    for peer in accepted:
        peer.close()
