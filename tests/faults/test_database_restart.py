"""Postgres killed under load (issue 18, item 7): callers get DATABASE_ERROR at once, `make run`
starts its embedded Postgres again, web and worker reconnect by themselves, nothing is half-written.

The whole system as a user starts it (`manage.py kb_run`, its own data directory). Two clients
write notes over the REST API without pause and an agent keeps a Streamable HTTP session open;
the embedded postmaster is killed with SIGKILL while the worker embeds. Then:
- every call made while the database is down answers within ``CALL_LIMIT`` seconds with the
  DATABASE_ERROR body (REST JSON, MCP tool error), and /health/ready says 503;
- the launcher starts Postgres again and writes succeed again within ``RECOVERY_DEADLINE``;
- the agent's session, opened before the kill, searches again;
- every note that was answered with success is there, every note is ready with one vector per
  chunk, and a note whose write failed is either absent or whole (the write was one transaction).
"""

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import free_port, wait_for
from tests.test_launcher import answers, start_launcher

CALL_LIMIT = 6.0  # seconds a call may take while the database is down (connect timeout 5 s)
RECOVERY_DEADLINE = 30.0  # from the kill to writes succeeding again
SETTLE_DEADLINE = 120.0  # every note embedded once the database is back
PARAGRAPH = "Note {n} paragraph {p}: the lift coefficient of wing section {n}-{p} was measured at speed {s}."


@dataclass
class Call:
    started: float
    seconds: float
    status: int
    code: str | None


@dataclass
class Writer:
    """Writes notes one after another until stopped, remembering each answer."""

    base: str
    name: str
    calls: dict[str, Call] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            number += 1
            title = f"{self.name}-{number}"
            # Several chunks per note, so that the worker is embedding when the database dies.
            text = "\n\n".join(PARAGRAPH.format(n=title, p=p, s=p * 7) * 12 for p in range(6))
            body = {"uri": "data:text/plain," + urllib.request.quote(text), "title": title}
            self.calls[title] = post(f"{self.base}/api/collections/notes/documents", body)


def post(url: str, body: dict) -> Call:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Call(started, time.monotonic() - started, response.status, None)
    except urllib.error.HTTPError as error:
        code = json.loads(error.read())["error"]["code"]  # any other body fails the test here
        return Call(started, time.monotonic() - started, error.code, code)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


async def search_result(session: ClientSession) -> tuple[float, bool, str]:
    started = time.monotonic()
    result = await session.call_tool("rag_search", {"query": "lift coefficient", "collection": "notes"})
    return time.monotonic() - started, result.is_error, result.content[0].text


@pytest.mark.timeout(600)
def test_a_killed_database_is_started_again_and_nothing_is_lost_or_half_written(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pgdata = tmp_path / "var" / "pgdata"
    launcher = start_launcher(tmp_path, port)
    writers = [Writer(base, "w1"), Writer(base, "w2")]
    threads = [threading.Thread(target=writer.run) for writer in writers]
    try:
        wait_for(lambda: answers(f"{base}/health/ready") or not launcher.alive(), timeout=180, what="make run")
        assert launcher.alive(), launcher.log()
        assert post(f"{base}/api/collections", {"name": "notes"}).status == 201
        asyncio.run(agent_through_the_outage(base, pgdata, writers, threads))
    finally:
        for writer in writers:
            writer.stopping.set()
        for thread in threads:
            thread.join(timeout=90)
        if launcher.alive():
            os.kill(launcher.process.pid, signal.SIGINT)
            launcher.process.wait(timeout=60)
        launcher.stop()
    log = launcher.log()
    assert "The embedded Postgres stopped unexpectedly; starting it again." in log, log[-3000:]
    assert "The embedded Postgres is running again." in log, log[-3000:]
    assert "Embedded Postgres stopped." in log  # the restarted server is the launcher's to stop
    assert not pgdata.joinpath("postmaster.pid").exists()


async def agent_through_the_outage(base: str, pgdata: Path, writers: list[Writer], threads) -> None:
    async with streamable_http_client(f"{base}/mcp") as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for thread in threads:
            thread.start()
        # Kill once the worker has notes in hand: some ready, more still to embed.
        await asyncio.to_thread(
            wait_for, lambda: sum(map(len, (w.calls for w in writers))) >= 6, timeout=60, what="writes"
        )
        killed = time.monotonic()
        os.kill(postmaster_pid(pgdata), signal.SIGKILL)

        # While it is down: answers come at once and say what happened.
        seconds, is_error, text = await search_result(session)
        assert is_error and json.loads(text)["error"]["code"] == "DATABASE_ERROR", text
        assert seconds < CALL_LIMIT
        assert await asyncio.to_thread(status_of, f"{base}/health/ready") == 503

        # The launcher starts it again; writes succeed again.
        def recovered() -> bool:
            last = [max(w.calls.values(), key=lambda call: call.started) for w in writers]
            return all(call.started > killed and call.status == 200 for call in last)

        await asyncio.to_thread(wait_for, recovered, timeout=RECOVERY_DEADLINE, what="writes to succeed again")
        recovered_after = time.monotonic() - killed
        seconds, is_error, text = await search_result(session)
        assert not is_error and json.loads(text)["results"], text
        for writer in writers:
            writer.stopping.set()
        for thread in threads:
            await asyncio.to_thread(thread.join, 90)

    calls = {title: call for writer in writers for title, call in writer.calls.items()}
    failed = {title: call for title, call in calls.items() if call.status != 200}
    during = [call for call in calls.values() if call.started > killed and call.status != 200]
    print(
        f"\n{len(calls)} writes, {len(failed)} refused while the database was down "
        f"(slowest {max(call.seconds for call in during):.2f} s); writes succeed again "
        f"{recovered_after:.1f} s after the kill"
    )
    assert during, "no write was made while the database was down"
    assert {call.code for call in failed.values()} == {"DATABASE_ERROR"}
    assert all(call.seconds < CALL_LIMIT for call in failed.values()), failed
    await asyncio.to_thread(every_note_whole, pgdata, calls)


def every_note_whole(pgdata: Path, calls: dict[str, Call]) -> None:
    succeeded = {title for title, call in calls.items() if call.status == 200}

    def settled() -> bool:
        return not rows("SELECT 1 FROM kb_document WHERE status NOT IN ('ready', 'failed')")

    def rows(sql: str) -> list[tuple]:
        with psycopg.connect(host=str(pgdata), user="postgres", dbname="kb") as connection:
            return connection.execute(sql).fetchall()

    wait_for(settled, timeout=SETTLE_DEADLINE, what="every note to be embedded")
    documents = dict(rows("SELECT title, status FROM kb_document"))
    assert succeeded <= set(documents), "a write answered with success is missing"
    assert set(documents) <= set(calls)
    assert set(documents.values()) == {"ready"}, documents
    per_note = rows(
        "SELECT d.title, count(c.id), count(e.chunk_id) FROM kb_document d "
        "LEFT JOIN kb_chunk c ON c.document_id = d.id LEFT JOIN kb_embedding e ON e.chunk_id = c.id "
        "GROUP BY d.title"
    )
    assert len(per_note) == len(documents)
    for title, chunks, vectors in per_note:
        assert chunks > 1 and vectors == chunks, (title, chunks, vectors)
