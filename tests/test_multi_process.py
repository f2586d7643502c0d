"""Two ASGI hosts in stateless Streamable HTTP mode (MCP_STATELESS_HTTP) behind one client, as behind
a load balancer: the SDK's own client over real sockets, each of its HTTP requests sent to the next
server in turn, through a whole ingest, search and delete on the canonical tools."""

import base64
import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import ChildProcess, child_env, free_port, wait_for
from tests.support.mcp_client import structured
from tests.support.mcp_server import listening

KEYWORD = "zirconquill"  # a word no other text has: a keyword search finds only this note
NOTE = f"# Field notes\n\nThe {KEYWORD} sensor logs the humidity of the greenhouse every minute.\n"
ACCESS_LINE = re.compile(r'"(?:GET|POST|DELETE) /mcp HTTP/1\.1" \d{3}')


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next of ``ports`` in turn, whatever port its URL names, and
    remembers where each went: (port, HTTP method, JSON-RPC method or "")."""

    def __init__(self, ports: list[int]) -> None:
        self._next_port = itertools.cycle(ports)
        self._inner = httpx2.AsyncHTTPTransport()
        self.sent: list[tuple[int, str, str]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self._next_port)
        request.url = request.url.copy_with(port=port)
        request.headers["Host"] = f"127.0.0.1:{port}"
        body = await request.aread()
        message = json.loads(body) if body else {}
        self.sent.append((port, request.method, message.get("method", "")))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def to(self, port: int, *, rpc_method: str | None = None) -> int:
        """How many requests went to ``port`` (only those of ``rpc_method`` when given)."""
        return sum(1 for sent_port, _, method in self.sent if sent_port == port and rpc_method in (None, method))


@pytest.fixture
def stateless_servers(tmp_path: Path, transactional_db: None) -> Iterator[dict[int, ChildProcess]]:
    """Two uvicorn processes of the ASGI host, stateless, on the test database and the default broker."""
    ports: list[int] = []
    while len(ports) < 2:  # two different ports, though neither is bound until its server starts
        ports += {free_port()} - set(ports)
    servers: dict[int, ChildProcess] = {}
    try:
        for name, port in zip(("first", "second"), ports, strict=True):
            command = [
                sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port)
            ]  # fmt: skip
            env = {**child_env(), "MCP_STATELESS_HTTP": "1"}
            servers[port] = ChildProcess(command, env, tmp_path / f"uvicorn-{name}.log")
        for port, server in servers.items():
            wait_for(lambda: listening(port) or not server.alive(), timeout=90, what=f"uvicorn on {port} to listen")  # noqa: B023
            assert server.alive(), server.log()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


async def ingest_search_delete(session: ClientSession) -> dict[str, Any]:
    """What an agent does with the canonical tools: the document written, and what the keyword search
    found before and after its deletion."""

    async def tool(name: str, arguments: dict[str, Any]) -> Any:
        return structured(await session.call_tool(name, arguments))

    def sources(found: dict[str, Any]) -> list[str]:
        return [result["source"] for result in found["results"]]

    search = {"query": KEYWORD, "collection": "spread", "mode": "keyword"}
    await tool("rag_create_collection", {"name": "spread"})
    uri = "data:text/markdown;base64," + base64.b64encode(NOTE.encode()).decode()
    doc_id = (await tool("rag_ingest", {"uri": uri, "collection": "spread"}))["doc_id"]
    before = await tool("rag_search", search)
    await tool("rag_delete", {"doc_id": doc_id})
    after = await tool("rag_search", search)
    return {"doc_id": doc_id, "found_before": sources(before), "found_after": sources(after)}


def test_one_client_session_is_served_by_two_stateless_processes_in_turn(stateless_servers):
    ports = list(stateless_servers)
    balancer = RoundRobin(ports)

    async def run() -> dict[str, Any]:
        # The URL names the first server; the transport decides where each request really goes.
        async with (
            httpx2.AsyncClient(transport=balancer, timeout=httpx2.Timeout(30, read=60)) as http,
            streamable_http_client(f"http://127.0.0.1:{ports[0]}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await ingest_search_delete(session)

    flow = anyio.run(run)

    # Every call succeeded (structured), the keyword found the note, and nothing once it was deleted.
    assert flow["found_before"] == [flow["doc_id"]]
    assert flow["found_after"] == []
    # Both processes answered tool calls...
    assert [balancer.to(port, rpc_method="tools/call") >= 1 for port in ports] == [True, True], balancer.sent
    # ...and each really received the requests sent to it, by its own access log.
    for port, server in stateless_servers.items():
        wait_for(
            lambda: len(ACCESS_LINE.findall(server.log())) >= balancer.to(port),  # noqa: B023
            timeout=10,
            what=f"the access log of {port}",
        )
        assert len(ACCESS_LINE.findall(server.log())) == balancer.to(port), server.log()
