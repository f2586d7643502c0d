"""The real ASGI host (Django + MCP) under uvicorn, for tests over real sockets, with the test
database and a fake Ollama (a remote service, hence faked) so that no process loads a local model.

One server serves a whole test module: starting one costs seconds, and tests keep apart by the
names they use, not by a fresh process.
"""

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
from django.db import connection
from django.test import override_settings

from tests.conftest import ChildProcess, child_env, free_port, wait_for
from tests.support.fake_providers import fake_ollama
from tests.support.worker import embed_pending

FAKE_MODEL = "fake-embed"
# A raw Streamable HTTP session's opening request, and the Accept header it needs.
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}  # fmt: skip
STREAMABLE = {"Accept": "application/json, text/event-stream"}


@contextmanager
def fake_embedder() -> Iterator[dict[str, str]]:
    """A fake Ollama, used by this process and by the children given the environment it yields."""
    with fake_ollama() as base, override_settings(OLLAMA_HOST=base):
        yield {"EMBEDDING_PROVIDER": "ollama", "EMBEDDING_MODEL": FAKE_MODEL, "OLLAMA_HOST": base}


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def uvicorn_server(log_dir: Path, extra_env: dict[str, str]) -> Iterator[str]:
    """The ASGI host on a free loopback port, with the test database; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    server = ChildProcess(command, {**child_env(), **extra_env}, log_dir / f"uvicorn-{port}.log")
    try:
        wait_for(lambda: listening(port) or not server.alive(), timeout=60, what="uvicorn to listen")
        assert server.alive(), server.log()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


async def embed_in_thread() -> int:
    """What a worker does, from a thread of this process (tests that run no worker)."""

    def embed() -> int:
        try:
            return embed_pending()
        finally:
            connection.close()

    return await anyio.to_thread.run_sync(embed)
