"""Driving the MCP servers from tests with the SDK's own clients: in memory (the server runs in this
process; its tools use the database from their own threads, so tests need committed data), or over
SSE / Streamable HTTP against a running server."""

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from kb.access import FULL_ACCESS, Access
from mcp_endpoint.caller import Caller, calling_as
from mcp_endpoint.tooling import KBServer, stop_tool_threads

# Committed data: the servers' tool threads and processes must see it.
committed_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tool_threads() -> Iterator[None]:
    """Close the tool threads' database connections after the test (the test database is dropped
    at the end of the session, which open connections prevent)."""
    yield
    stop_tool_threads()


def call(server: KBServer, tool: str, arguments: dict[str, Any] | None = None, *, access: Access | None = FULL_ACCESS):
    """Call a tool in memory as ``access`` (None: as a request without any caller)."""

    async def run() -> CallToolResult:
        async with connected(server, access) as client:
            return await client.call_tool(tool, arguments or {})

    return anyio.run(run)


def call_ok(server: KBServer, tool: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    return structured(call(server, tool, arguments, **kwargs))


def call_text(server: KBServer, tool: str, arguments: dict[str, Any] | None = None, **kwargs: Any) -> str:
    result = call(server, tool, arguments, **kwargs)
    assert not result.is_error, result.content
    return "".join(block.text for block in result.content)


def error_of(result: CallToolResult) -> dict[str, str]:
    """rag-mcp's {"code", "message"} of a failed call, read from the text the client shows the model."""
    assert result.is_error, result
    return json.loads(result.content[0].text)["error"]


def in_memory(server: KBServer, action: Any, access: Access | None = FULL_ACCESS) -> Any:
    """Run ``await action(client)`` against ``server`` in memory."""

    async def run() -> Any:
        async with connected(server, access) as client:
            return await action(client)

    return anyio.run(run)


def tools_of(server: KBServer, access: Access | None = FULL_ACCESS) -> dict[str, Any]:
    """The tools ``server`` lists to ``access``, by name."""
    listed = in_memory(server, lambda client: client.list_tools(), access)
    return {tool.name: tool for tool in listed.tools}


@asynccontextmanager
async def connected(server: KBServer, access: Access | None) -> AsyncIterator[Client]:
    caller = Caller(access=access) if access is not None else None
    with calling_as(caller):
        async with Client(server) as client:
            yield client


@asynccontextmanager
async def sse_session(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    async with sse_client(url, headers=headers) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    import httpx2

    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def stdio_server(*options: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    """``manage.py mcp_stdio`` as an MCP client spawns it, on the test database."""
    from tests.conftest import ROOT, child_env

    return StdioServerParameters(
        command=sys.executable, args=["manage.py", "mcp_stdio", *options], env={**child_env(), **(env or {})}, cwd=ROOT
    )


@asynccontextmanager
async def stdio_session(*options: str, env: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    async with stdio_client(stdio_server(*options, env=env)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def structured(result: CallToolResult) -> Any:
    """The structured result of a call that must succeed (a list comes wrapped as {"result": [...]})."""
    assert not result.is_error, result.content
    content = result.structured_content
    if isinstance(content, dict) and set(content) == {"result"}:
        return content["result"]
    # Clients that read only text get the same object, as one JSON text.
    assert [json.loads(block.text) for block in result.content] == [content]
    return content
