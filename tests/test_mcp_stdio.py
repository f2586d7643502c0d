"""``manage.py mcp_stdio``, spawned as MCP clients do: the SDK's stdio client lists and calls tools,
profiles and read-only mode are chosen on the command line, and stdout carries protocol only."""

import json
import subprocess
import sys

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kb.models import Document
from tests.conftest import ROOT, child_env
from tests.support.mcp_client import committed_db, stdio_server, structured, tool_threads  # noqa: F401

pytestmark = [committed_db, pytest.mark.usefixtures("tool_threads")]


async def with_session(parameters: StdioServerParameters, action):
    async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await action(session)


def test_an_agent_works_with_the_tools_over_stdio(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\nThe turbine blades are inspected every spring.\n")

    async def session_work(session):
        tools = [tool.name for tool in (await session.list_tools()).tools]
        assert "rag_search" in tools and "rag_ingest" in tools
        assert structured(await session.call_tool("rag_create_collection", {"name": "local"}))["success"]
        uri = f"file://{tmp_path}/guide.md"
        ingested = structured(await session.call_tool("rag_ingest", {"uri": uri, "collection": "local"}))
        found = structured(await session.call_tool("rag_search", {"query": "turbine blades", "hybrid": False}))
        return ingested, found

    ingested, found = anyio.run(with_session, stdio_server(env={"KB_FILE_ROOTS": str(tmp_path)}), session_work)
    assert (ingested["content_type"], ingested["outcome"]) == ("markdown", "created")
    assert found["results"][0]["source"] == ingested["doc_id"]
    assert Document.objects.get(pk=ingested["doc_id"]).title == "Guide"


async def tool_names(session) -> list[str]:
    return sorted(tool.name for tool in (await session.list_tools()).tools)


def test_the_profile_is_chosen_on_the_command_line():
    assert anyio.run(with_session, stdio_server("--profile", "scirag"), tool_names) == [
        "list_collections", "retrieve_document_chunks", "store_document_chunks"
    ]  # fmt: skip


def test_read_only_mode_is_chosen_on_the_command_line():
    assert anyio.run(with_session, stdio_server("--profile", "ragmcpserver", "--read-only"), tool_names) == ["Query"]


def test_stdout_carries_nothing_but_protocol_messages():
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "rag_stats", "arguments": {}}},
    ]  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "manage.py", "mcp_stdio"], cwd=ROOT, env=child_env(), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    replies = []
    try:
        for request in requests:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            if "id" in request:
                replies.append(json.loads(process.stdout.readline()))
        process.stdin.close()  # the client is done: the server ends
        rest = process.stdout.read()
        process.wait(timeout=30)
    finally:
        process.kill()
        process.stdout.close()
        process.stderr.close()
    assert [reply["id"] for reply in replies] == [1, 2]
    assert replies[1]["result"]["structuredContent"]["collections"] == 0
    assert rest == ""
