"""One caller cannot hold every MCP session (MCP_MAX_SESSIONS_PER_CALLER), on a real server: an
attack helper's one token had opened 10,000 Streamable HTTP sessions and left every other client
with 503 for the SDK's 30 idle minutes."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.tokens import token_create
from tests.support.mcp_client import committed_db
from tests.support.mcp_server import INITIALIZE, STREAMABLE, uvicorn_server

pytestmark = [committed_db]

LIMIT = 3
CALLS = 2


@pytest.fixture(scope="module")
def server_url(django_db_setup, tmp_path_factory):
    limits = {"MCP_MAX_SESSIONS_PER_CALLER": str(LIMIT), "MCP_MAX_CALLS_PER_SESSION": str(CALLS)}
    with uvicorn_server(tmp_path_factory.mktemp("uvicorn"), limits) as url:
        yield url


def opened(client: httpx.Client, headers: dict[str, str] | None = None) -> httpx.Response:
    return client.post("/mcp", json=INITIALIZE, headers=headers)


def test_a_caller_at_its_limit_is_refused_new_sessions_and_others_are_not(server_url):
    _, raw = token_create(name="hoarder", scope="read")
    hoarder = {"Authorization": f"Bearer {raw}"}
    with httpx.Client(base_url=server_url, timeout=10, headers=STREAMABLE) as client:
        sessions = [opened(client, hoarder).headers["mcp-session-id"] for _ in range(LIMIT)]
        refused = opened(client, hoarder)
        assert refused.status_code == 429
        assert "MCP_MAX_SESSIONS_PER_CALLER" in refused.json()["error"]["message"]
        with client.stream("GET", "/sse", headers=hoarder) as stream:  # an SSE session counts too
            assert stream.status_code == 429
        assert opened(client).status_code == 200  # another caller (here: no token, an address)
        session = {**hoarder, "Mcp-Session-Id": sessions[0]}
        assert client.delete("/mcp", headers=session).status_code == 200  # one closed: one more may open
        assert opened(client, hoarder).status_code == 200
        assert opened(client, hoarder).status_code == 429
        for made_up in ("0" * 32, "f" * 32):  # ids it never opened do not count, nor cost memory
            client.delete("/mcp", headers={**hoarder, "Mcp-Session-Id": made_up})
            client.post("/mcp", json=INITIALIZE, headers={**hoarder, "Mcp-Session-Id": made_up})
        assert opened(client).status_code == 200


def test_open_sse_streams_count_until_they_close(server_url):
    with httpx.Client(base_url=server_url, timeout=10) as client:
        _, raw = token_create(name="streams", scope="read")
        streams = {"Authorization": f"Bearer {raw}"}
        contexts = [client.stream("GET", "/sse", headers=streams) for _ in range(LIMIT)]
        responses = [context.__enter__() for context in contexts]
        assert [response.status_code for response in responses] == [200] * LIMIT
        with client.stream("GET", "/sse", headers=streams) as refused:
            assert refused.status_code == 429
        for context in contexts:
            context.__exit__(None, None, None)


def test_a_session_idle_as_long_as_the_sdk_keeps_one_no_longer_counts(monkeypatch):
    from mcp_endpoint import sessions

    now = [1000.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: now[0])
    quota = sessions.SessionQuota(limit=1, idle_seconds=1800)
    quota.seen("token 1", "a")
    assert not quota.admits("token 1") and quota.admits("token 2")
    now[0] += 1799
    assert not quota.admits("token 1")
    with quota.serving("token 1", "a"):  # used again: idle from the end of the request
        pass
    with quota.serving("token 2", "made-up"):  # never opened: not counted
        pass
    assert quota.admits("token 2")
    now[0] += 1799
    assert not quota.admits("token 1")
    now[0] += 2
    assert quota.admits("token 1")


def test_a_session_with_a_request_in_flight_is_not_idle(monkeypatch):
    """The SDK keeps a session while its GET stream of notifications is open, however long."""
    from mcp_endpoint import sessions

    now = [1000.0]
    monkeypatch.setattr(sessions.time, "monotonic", lambda: now[0])
    quota = sessions.SessionQuota(limit=1, idle_seconds=1800)
    quota.seen("token 1", "a")
    with quota.serving("token 1", "a"):
        now[0] += 3 * 1800
        assert not quota.admits("token 1")
    now[0] += 1799
    assert not quota.admits("token 1")  # idle from the stream's end
    now[0] += 2
    assert quota.admits("token 1")


def test_head_is_not_a_way_around_the_session_limit(server_url):
    """Starlette answered HEAD /sse as GET: an SSE stream no limit counted, ending in a traceback."""
    _, raw = token_create(name="heads", scope="read")
    with httpx.Client(base_url=server_url, timeout=10, headers={"Authorization": f"Bearer {raw}"}) as client:
        for path in ("/sse", "/mcp", "/messages/"):
            assert client.head(path).status_code == 405, path


def slow_call(request_id: int, doc_id: str) -> dict:
    """A call that waits 3 s: the status of a document no worker embeds (none runs here)."""
    arguments = {"doc_ids": [doc_id], "wait_seconds": 3}
    params = {"name": "rag_ingestion_status", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def test_an_sse_session_may_have_only_so_many_requests_waiting_for_answers(server_url):
    """One session's unread answers had grown the web process by 960 MB, and its slow searches had
    held every reading thread: a session's requests wait for answers MCP_MAX_CALLS_PER_SESSION at most."""
    pending = document_create_from_text(collection=collection_create(name="waits"), source_uri="n", text="Note.")
    doc_id = pending.document.pk
    with httpx.Client(base_url=server_url, timeout=30) as client, client.stream("GET", "/sse") as stream:
        lines = stream.iter_lines()
        endpoint = next(line for line in lines if line.startswith("data: "))[len("data: ") :]

        def answered(*request_ids: int) -> None:
            waiting = set(request_ids)
            for line in lines:
                if line.startswith("data: "):
                    waiting.discard(json.loads(line[len("data: ") :]).get("id"))
                if not waiting:
                    return

        assert client.post(endpoint, json=INITIALIZE).status_code == 202
        answered(1)
        client.post(endpoint, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert [client.post(endpoint, json=slow_call(n, doc_id)).status_code for n in (2, 3)] == [202, 202]
        refused = client.post(endpoint, json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        assert refused.status_code == 429 and "MCP_MAX_CALLS_PER_SESSION" in refused.text
        notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert client.post(endpoint, json=notice).status_code == 202  # a notification waits for nothing
        answered(2, 3)  # in either order
        assert client.post(endpoint, json={"jsonrpc": "2.0", "id": 5, "method": "tools/list"}).status_code == 202
        answered(5)


def test_a_streamable_http_session_may_have_only_so_many_requests_waiting(server_url):
    pending = document_create_from_text(collection=collection_create(name="slow"), source_uri="n", text="Note.")
    _, raw = token_create(name="patient", scope="read")  # a caller of its own: the address's sessions are counted
    with httpx.Client(
        base_url=server_url, timeout=30, headers={**STREAMABLE, "Authorization": f"Bearer {raw}"}
    ) as client:
        session = {"Mcp-Session-Id": opened(client).headers["mcp-session-id"]}
        client.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        with ThreadPoolExecutor(CALLS) as pool:
            slow = [
                pool.submit(client.post, "/mcp", json=slow_call(n, pending.document.pk), headers=session)
                for n in (2, 3)
            ]
            time.sleep(1)  # both are being served
            refused = client.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, headers=session)
            assert refused.status_code == 429 and "MCP_MAX_CALLS_PER_SESSION" in refused.text
            assert [future.result().status_code for future in slow] == [200, 200]
        answer = client.post("/mcp", json={"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, headers=session)
        assert answer.status_code == 200


def test_an_oversized_message_is_refused_by_the_sdk_without_being_held_whole(server_url):
    """The guard reads a message to count it: past the SDK's 4 MiB it keeps no more of it."""
    import psutil

    port = int(server_url.rsplit(":", 1)[1])
    server = next(
        psutil.Process(c.pid) for c in psutil.net_connections("tcp") if c.laddr.port == port and c.status == "LISTEN"
    )

    def body(chunks: int = 256):  # 256 MiB, streamed
        for _ in range(chunks):
            yield b" " * (1 << 20)

    _, raw = token_create(name="large", scope="read")  # a caller of its own: the address's sessions are used up
    token = {"Authorization": f"Bearer {raw}"}
    with httpx.Client(base_url=server_url, timeout=60, headers={**STREAMABLE, **token}) as client:
        session = {"Mcp-Session-Id": opened(client).headers["mcp-session-id"]}
        before = server.memory_info().rss
        refused = client.post("/mcp", content=body(), headers={**session, "Content-Type": "application/json"})
        assert refused.status_code == 413
        assert server.memory_info().rss - before < 64 << 20


def test_a_message_nested_past_the_parser_gets_the_sdk_s_parse_error_not_a_crash(server_url):
    """The guard parses a session's messages to count requests: 100,000 open brackets had raised
    RecursionError in it, where the SDK answers -32700."""
    _, raw = token_create(name="nested", scope="read")
    with httpx.Client(
        base_url=server_url, timeout=30, headers={**STREAMABLE, "Authorization": f"Bearer {raw}"}
    ) as client:
        session = {"Mcp-Session-Id": opened(client).headers["mcp-session-id"], "Content-Type": "application/json"}
        nested = client.post("/mcp", content=b"[" * 100_000, headers=session)
        assert nested.status_code == 400 and nested.json()["error"]["code"] == -32700
    with httpx.Client(base_url=server_url, timeout=30) as client, client.stream("GET", "/sse") as stream:
        endpoint = next(line for line in stream.iter_lines() if line.startswith("data: "))[len("data: ") :]
        nested = client.post(endpoint, content=b"[" * 100_000, headers={"Content-Type": "application/json"})
        assert 400 <= nested.status_code < 500, nested.text  # the SDK's refusal (a crash in the guard was a 500)
