"""The MCP settings of a deployment, on a real server: MCP_DEFAULT_PROFILE decides what /sse and /mcp
serve, MCP_READ_ONLY leaves out every writing tool, MCP_STATELESS_HTTP serves Streamable HTTP without
sessions (for several web replicas)."""

import anyio
import httpx
import pytest

from tests.support.mcp_client import committed_db, http_session, sse_session, structured, tool_threads  # noqa: F401
from tests.support.mcp_server import INITIALIZE, STREAMABLE, uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]

SETTINGS = {"MCP_DEFAULT_PROFILE": "scirag", "MCP_READ_ONLY": "1", "MCP_STATELESS_HTTP": "1"}


@pytest.fixture(scope="module")
def server_url(django_db_setup, tmp_path_factory):
    with uvicorn_server(tmp_path_factory.mktemp("uvicorn"), SETTINGS) as url:
        yield url


def tool_names(session_of, url: str) -> list[str]:
    async def names() -> list[str]:
        async with session_of(url) as session:
            return sorted(tool.name for tool in (await session.list_tools()).tools)

    return anyio.run(names)


def test_the_default_profile_answers_at_the_seed_addresses_without_its_writing_tools(server_url):
    assert tool_names(sse_session, f"{server_url}/sse") == ["list_collections", "retrieve_document_chunks"]
    assert tool_names(http_session, f"{server_url}/mcp") == ["list_collections", "retrieve_document_chunks"]
    canonical = tool_names(http_session, f"{server_url}/profiles/canonical/mcp")
    assert "rag_search" in canonical and "rag_ingest" not in canonical and "rag_delete" not in canonical


def test_stateless_streamable_http_issues_no_session(server_url):
    with httpx.Client(base_url=server_url, timeout=10, headers=STREAMABLE) as client:
        initialized = client.post("/mcp", json=INITIALIZE)
    assert initialized.status_code == 200
    assert "mcp-session-id" not in initialized.headers

    async def call() -> list[str]:
        async with http_session(f"{server_url}/mcp") as session:
            return structured(await session.call_tool("list_collections", {}))

    assert anyio.run(call) == []
