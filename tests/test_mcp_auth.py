"""API tokens on the MCP HTTP transports, with authentication required (KB_REQUIRE_AUTH): a request
without a valid token is refused, a token sees only its collections and does only what its scope
allows, and a session can only be used with the token that opened it."""

import anyio
import httpx
import pytest
from mcp.client.sse import sse_client

from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.tokens import token_create
from tests.support.mcp_client import (  # noqa: F401
    committed_db,
    error_of,
    http_session,
    sse_session,
    structured,
    tool_threads,
)
from tests.support.mcp_server import uvicorn_server

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]


@pytest.fixture(scope="module")
def server_url(django_db_setup, tmp_path_factory):
    with uvicorn_server(tmp_path_factory.mktemp("uvicorn"), {"KB_REQUIRE_AUTH": "1"}) as url:
        yield url


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", ["/sse", "/mcp", "/profiles/scirag/sse", "/profiles/hybrid/mcp", "/messages/"])
def test_a_request_without_a_valid_token_is_refused(server_url, path):
    method = "GET" if path.endswith("/sse") else "POST"
    with httpx.Client(base_url=server_url, timeout=10) as client:
        anonymous = client.request(method, path)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "UNAUTHORIZED"
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        forged = client.request(method, path, headers=bearer("kb_0000_forged"))
        assert (forged.status_code, forged.json()["error"]["message"]) == (401, "Invalid API token")


def test_a_token_limited_to_a_collection_sees_nothing_else_on_either_transport(server_url):
    for name, text in (("open", "Wind tunnels measure lift."), ("secret", "Tunnels under the secret base.")):
        document_create_from_text(collection=collection_create(name=name), source_uri=f"{name}.txt", text=text)
    _, reader = token_create(name="reader", scope="read", collections=["open"])

    async def tool(session, name: str, arguments: dict):
        return await session.call_tool(name, arguments)

    async def run() -> None:
        async with sse_session(f"{server_url}/sse", headers=bearer(reader)) as session:
            listed = structured(await tool(session, "rag_list_collections", {}))
            assert [c["name"] for c in listed["collections"]] == ["open"]
            hits = structured(await tool(session, "rag_search", {"query": "tunnels", "hybrid": False}))["results"]
            assert [hit["collection"] for hit in hits] == ["open"]
            hidden = await tool(session, "rag_search", {"query": "tunnels", "collection": "secret"})
            assert hidden.is_error and error_of(hidden)["code"] == "COLLECTION_NOT_FOUND"
            ingest = await tool(session, "rag_ingest", {"uri": "data:,more", "collection": "open"})
            assert error_of(ingest)["code"] == "PERMISSION_DENIED"
        async with http_session(f"{server_url}/profiles/scirag/mcp", headers=bearer(reader)) as session:
            assert structured(await tool(session, "list_collections", {})) == ["open"]

    anyio.run(run)


def test_an_sse_session_is_bound_to_its_token(server_url):
    _, writer = token_create(name="writer", scope="write")
    _, other = token_create(name="other", scope="admin")
    sessions: list[str] = []

    async def run() -> tuple[int, int]:
        async with (
            sse_client(f"{server_url}/sse", headers=bearer(writer), on_session_created=sessions.append),
            httpx.AsyncClient(base_url=server_url) as client,
        ):
            message = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            endpoint = f"/messages/?session_id={sessions[0]}"
            hijack = await client.post(endpoint, json=message, headers=bearer(other))
            own = await client.post(endpoint, json=message, headers=bearer(writer))
            return hijack.status_code, own.status_code

    assert anyio.run(run) == (404, 202)  # another token finds no such session


def test_a_writing_token_writes(server_url):
    _, writer = token_create(name="writer", scope="write")

    async def create() -> dict:
        async with http_session(f"{server_url}/mcp", headers=bearer(writer)) as session:
            return structured(await session.call_tool("rag_create_collection", {"name": "written"}))

    assert anyio.run(create)["success"] is True
