"""The MCP transports over real sockets: the ASGI host under uvicorn, driven by the SDK's own SSE and
Streamable HTTP clients, every profile at its address, the SciRAG seed's client example, and the
Host/Origin check."""

import base64
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest

from tests.conftest import ROOT, child_env, start_worker
from tests.support.mcp_client import committed_db, http_session, sse_session, structured, tool_threads  # noqa: F401
from tests.support.mcp_seed_examples import (
    SCIRAG_CLIENT_EXAMPLE,
    SCIRAG_CLIENT_EXAMPLE_FOR_THE_SDK,
    SCIRAG_STORE_EXAMPLE_CHUNKS,
    SEED_ADDRESS,
)
from tests.support.mcp_server import embed_in_thread, fake_embedder, uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

NOTE = "# Wind tunnels\n\nA wind tunnel measures the lift and drag of a wing model in moving air.\n"
PROFILE_TOOLS = {
    "canonical": "rag_search",
    "scirag": "retrieve_document_chunks",
    "hybrid": "search_documents",
    "synthesis": "search_rag",
    "ragmcpserver": "Query",
}


@pytest.fixture(scope="module")
def embedder_env(django_db_setup):
    with fake_embedder() as env:
        yield env


@pytest.fixture(scope="module")
def server_url(embedder_env, tmp_path_factory):
    with uvicorn_server(tmp_path_factory.mktemp("uvicorn"), embedder_env) as url:
        yield url


async def a_whole_session(session, collection: str, embedding: Callable[[], Awaitable[object]]) -> dict:
    """Create a collection, ingest a data: URI, wait until it is embedded, search, read it as a
    resource, delete it: what an agent does, checked at each step."""

    async def tool(name: str, arguments: dict) -> dict:
        return structured(await session.call_tool(name, arguments))

    assert (await tool("rag_create_collection", {"name": collection}))["success"] is True
    uri = "data:text/markdown;base64," + base64.b64encode(NOTE.encode()).decode()
    ingested = await tool("rag_ingest", {"uri": uri, "collection": collection})
    assert (ingested["success"], ingested["content_type"], ingested["status"]) == (True, "markdown", "pending")
    doc_id = ingested["doc_id"]
    await embedding()
    status = await tool("rag_ingestion_status", {"doc_ids": [doc_id], "wait_seconds": 90})
    assert status["done"] is True and status["documents"][0]["status"] == "ready", status

    found = await tool("rag_search", {"query": "wing lift drag", "collection": collection, "mode": "semantic"})
    assert found["results"][0]["source"] == doc_id and found["results"][0]["similarity"] > 0
    resource = await session.read_resource(f"rag://documents/{doc_id}")
    assert json.loads(resource.contents[0].text)["raw_content"] == NOTE
    assert (await tool("rag_delete", {"doc_id": doc_id}))["deleted_doc_id"] == doc_id
    assert (await tool("rag_delete_collection", {"name": collection, "confirm": True}))["success"] is True
    return found


def test_an_sse_client_works_through_a_whole_session_with_a_worker(server_url, embedder_env, tmp_path):
    worker = start_worker(tmp_path, extra_env=embedder_env, name="mcp-worker")
    try:

        async def run() -> None:
            async with sse_session(f"{server_url}/sse") as session:
                await a_whole_session(session, "over-sse", anyio.lowlevel.checkpoint)

        anyio.run(run)
    finally:
        worker.stop()


def test_a_streamable_http_client_works_through_a_whole_session(server_url):
    async def run() -> None:
        async with http_session(f"{server_url}/mcp") as session:
            await a_whole_session(session, "over-http", embed_in_thread)

    anyio.run(run)


def test_every_profile_answers_on_both_transports_at_its_address(server_url):
    async def tool_names(session_of, url: str) -> list[str]:
        async with session_of(url) as session:
            return [tool.name for tool in (await session.list_tools()).tools]

    async def run() -> None:
        assert PROFILE_TOOLS["canonical"] in await tool_names(sse_session, f"{server_url}/sse")
        assert PROFILE_TOOLS["canonical"] in await tool_names(http_session, f"{server_url}/mcp")
        for profile, tool in PROFILE_TOOLS.items():
            assert tool in await tool_names(sse_session, f"{server_url}/profiles/{profile}/sse"), profile
            assert tool in await tool_names(http_session, f"{server_url}/profiles/{profile}/mcp"), profile

    anyio.run(run)


def test_streamable_http_sessions_are_stateful_by_default(server_url):
    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    with httpx.Client(base_url=server_url, timeout=10) as client:
        initialized = client.post("/mcp", json=initialize, headers={"Accept": "application/json, text/event-stream"})
    assert initialized.status_code == 200 and initialized.headers["mcp-session-id"]


def run_example(code: str, sse_url: str) -> subprocess.CompletedProcess:
    script = code.replace(SEED_ADDRESS, sse_url)
    assert script != code
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60
    )


def test_the_scirag_seeds_client_example_runs_against_the_scirag_profile(server_url):
    address = server_url.replace("127.0.0.1", "localhost") + "/profiles/scirag/sse"

    async def store() -> None:
        async with sse_session(address) as session:
            result = await session.call_tool(
                "store_document_chunks", {"chunks": SCIRAG_STORE_EXAMPLE_CHUNKS, "collection": "research-papers"}
            )
            assert structured(result)["message"].startswith("Successfully stored 2 chunks")
        await embed_in_thread()

    anyio.run(store)
    verbatim = run_example(SCIRAG_CLIENT_EXAMPLE, address)
    assert "Available collections: " in verbatim.stdout and "research-papers" in verbatim.stdout
    # The loop over call_tool's result is where the example and the SDK part: see mcp_seed_examples.
    assert verbatim.returncode == 1
    assert "TypeError: tuple indices must be integers or slices, not str" in verbatim.stderr

    adapted = run_example(SCIRAG_CLIENT_EXAMPLE_FOR_THE_SDK, address)
    assert adapted.returncode == 0, adapted.stderr
    lines = adapted.stdout.splitlines()
    assert lines[1].endswith("paper.pdf: First paragraph of the document......") or lines[1].endswith(
        "paper.pdf: Second paragraph continues......"
    )
    assert len(lines) == 3 and all(line.startswith("[0.") or line.startswith("[1.00]") for line in lines[1:])


@pytest.mark.parametrize("path", ["/sse", "/mcp", "/profiles/scirag/sse", "/profiles/synthesis/mcp"])
def test_a_wrong_host_or_origin_is_refused(server_url, path):
    method = "GET" if path.endswith("/sse") else "POST"
    port = server_url.rsplit(":", 1)[1]
    with httpx.Client(base_url=server_url, timeout=10) as client:
        wrong_host = client.request(method, path, headers={"Host": f"attacker.example:{port}"})
        assert (wrong_host.status_code, wrong_host.text) == (421, "Invalid Host header")
        wrong_origin = client.request(method, path, headers={"Origin": "http://attacker.example"})
        assert (wrong_origin.status_code, wrong_origin.json()["error"]["code"]) == (403, "PERMISSION_DENIED")
        posted = client.post("/messages/?session_id=0", headers={"Origin": "http://attacker.example"}, json={})
        assert posted.status_code == 403


def refused_status(error: BaseException) -> int | None:
    """The HTTP status behind an SDK client's failure (it arrives wrapped in exception groups)."""
    if isinstance(error, BaseExceptionGroup):
        return next(filter(None, (refused_status(inner) for inner in error.exceptions)), None)
    response = getattr(error, "response", None)
    return response.status_code if response is not None else None


def test_an_allowed_origin_gets_through(server_url):
    async def run() -> None:
        own_page = {"Origin": server_url}  # a page of this server (same host and port)
        async with http_session(f"{server_url}/mcp", headers=own_page) as session:
            assert (await session.list_tools()).tools

    anyio.run(run)


def test_the_sdk_client_is_refused_a_wrong_origin(server_url):
    async def run() -> int | None:
        try:
            # Another program's page on another local port (e.g. the MCP Inspector's) is another
            # site unless DJANGO_CSRF_TRUSTED_ORIGINS names it.
            async with sse_session(f"{server_url}/sse", headers={"Origin": "http://localhost:6274"}):
                pass
        except Exception as error:  # noqa: BLE001 - looked into below
            return refused_status(error)
        return None

    assert anyio.run(run) == 403
