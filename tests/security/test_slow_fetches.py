"""Slow fetches cannot hold readers hostage: while as many rag_ingest calls as there are threads
wait on a URL that does not answer, another client's reads still answer (writes run on a pool of
their own). The fetches are held until the reader has its answer, then released."""

import threading

import anyio
import pytest

from kb.models import Document
from kb.services.collections import collection_create
from mcp_endpoint.tooling import POOL_SIZES
from tests.support.http_server import serve
from tests.support.mcp_client import committed_db, http_session, sse_session, structured, tool_threads  # noqa: F401
from tests.support.mcp_server import uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

SLOW_CLIENTS = 2 * POOL_SIZES["read"]  # more than every tool thread there is


@pytest.fixture
def held_url():
    """A URL whose answer waits until the test releases it; counts the fetches waiting."""
    release = threading.Event()
    waiting = threading.Semaphore(0)

    def slow(handler, body):
        waiting.release()
        release.wait(timeout=60)
        return 200, {"content-type": "text/plain"}, b"Finally, the slow page about gliders."

    with serve({"/slow": slow}) as base:
        yield f"{base}/slow", release, waiting
        release.set()


@pytest.mark.timeout(120)
def test_reads_answer_while_slow_fetches_fill_the_write_threads(tmp_path, held_url):
    url, release, waiting = held_url
    collection_create(name="web")
    environment = {"KB_FETCH_ALLOWED_PRIVATE_HOSTS": "127.0.0.1", "KB_FETCH_TIMEOUT_SECONDS": "60"}
    with uvicorn_server(tmp_path, environment) as server_url:

        async def slow_ingest(index: int) -> None:
            async with http_session(f"{server_url}/mcp") as session:
                await session.call_tool("rag_ingest", {"uri": f"{url}?n={index}", "collection": "web"})

        async def read_while_held() -> dict:
            # Every write thread is inside a held fetch before the reader asks.
            for _ in range(POOL_SIZES["write"]):
                await anyio.to_thread.run_sync(lambda: waiting.acquire(timeout=60))
            async with sse_session(f"{server_url}/sse") as session:
                with anyio.fail_after(30):  # a deadlock guard: the fetches are held until this returns
                    stats = structured(await session.call_tool("rag_stats", {}))
            assert not release.is_set()
            release.set()
            return stats

        async def run() -> dict:
            result: dict = {}

            async def reader() -> None:
                result.update(await read_while_held())

            async with anyio.create_task_group() as group:
                for index in range(SLOW_CLIENTS):
                    group.start_soon(slow_ingest, index)
                group.start_soon(reader)
            return result

        stats = anyio.run(run)
    assert stats["collections"] >= 1
    assert Document.objects.filter(collection__name="web").count() == SLOW_CLIENTS
