"""Round-trip latency of rag_search over the MCP transports, against the search service in-process.

The ASGI host runs under uvicorn (its own process, on var/bench's data, as `make run` would serve
it); the SDK's own SSE and Streamable HTTP clients call rag_search with the Cranfield queries; the
same queries go to kb.search.search directly in this process. Every path runs all queries once
before timing (query embeddings are then cached on both sides), so the difference between a
transport and the in-process call is what the transport adds: HTTP, JSON-RPC, argument and result
validation, serialisation and the hop to a tool thread.

Prints p50/p95 per path for 1 client and for N concurrent clients (sessions, or threads in-process),
and the SDK's bare round trip (ping) on each transport: the floor under any tool call.

    .venv/bin/python bench/mcp.py [--queries 100] [--clients 20] [--top-k 10]
"""

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

# This file is called mcp.py like the SDK's package: find the SDK without this directory on the path.
BENCH = str(Path(__file__).resolve().parent)
sys.path[:] = [entry for entry in sys.path if entry != BENCH]
from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

sys.path.insert(0, BENCH)
from common import ROOT, Timer, load_beir, percentile, setup_django  # noqa: E402

Session = Callable[[str], AbstractAsyncContextManager]


@asynccontextmanager
async def sse_session(url: str):
    async with sse_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str):
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [
        sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
        "--lifespan", "on", "--no-access-log",  # as kb.launcher starts it
    ]  # fmt: skip
    log_path = Path(os.environ["KB_VAR_DIR"], "uvicorn-mcp.log")  # setup_django has set it
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the server
    server = subprocess.Popen(command, cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return server, f"http://127.0.0.1:{port}"
        time.sleep(0.2)
    server.kill()
    raise SystemExit(f"uvicorn did not start: see {log_path}")


async def client_latencies(
    session_of: Session, url: str, arguments: list[dict], rounds: int, start: asyncio.Barrier | None = None
) -> list[float]:
    """One client session: every call once to warm up, then (all clients together) timed passes."""
    async with session_of(url) as session:
        for args in arguments:
            await call(session, args)
        if start is not None:
            await start.wait()
        seconds = []
        for _ in range(rounds):
            for args in arguments:
                started = time.perf_counter()
                await call(session, args)
                seconds.append(time.perf_counter() - started)
    return seconds


async def ping_latencies(session_of: Session, url: str, count: int = 200) -> list[float]:
    """The SDK's own round trip with no work behind it: the floor under every tool call."""
    async with session_of(url) as session:
        seconds = []
        for _ in range(count):
            started = time.perf_counter()
            await session.send_ping()
            seconds.append(time.perf_counter() - started)
    return seconds[count // 10 :]


async def call(session, arguments: dict) -> None:
    result = await session.call_tool("rag_search", arguments)
    if result.is_error:
        raise SystemExit(f"rag_search failed: {result.content[0].text}")


async def concurrent(session_of: Session, url: str, arguments: list[dict], clients: int) -> tuple[list[float], float]:
    start = asyncio.Barrier(clients + 1)
    tasks = [
        asyncio.create_task(client_latencies(session_of, url, arguments[n:] + arguments[:n], 1, start))
        for n in range(clients)
    ]
    await start.wait()
    started = time.perf_counter()
    results = await asyncio.gather(*tasks)
    return [seconds for client in results for seconds in client], time.perf_counter() - started


def in_process(arguments: list[dict], clients: int) -> tuple[list[float], float]:
    from django.db import connection

    from kb.search import search

    def run(args: dict) -> float:
        started = time.perf_counter()
        search(query=args["query"], collections=[args["collection"]], top_k=args["top_k"])
        return time.perf_counter() - started

    def client(offset: int) -> list[float]:
        try:
            return [run(args) for args in arguments[offset:] + arguments[:offset]]
        finally:
            connection.close()

    for args in arguments:  # warm-up: embeddings cached, pages in memory
        run(args)
    if clients == 1:
        return [run(args) for args in arguments], 0.0
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(client, range(clients)))
    return [seconds for result in results for seconds in result], time.perf_counter() - started


def row(label: str, clients: int, seconds: list[float], wall: float) -> tuple[str, float]:
    throughput = f"{len(seconds) / wall:8.0f}" if wall else "       -"
    p50 = percentile(seconds, 0.5) * 1000
    print(f"  {label:<20} {clients:>7} {p50:9.1f} {percentile(seconds, 0.95) * 1000:9.1f} {throughput}")
    return label, p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args()

    setup_django()
    from quality import ingest

    corpus, queries, _ = load_beir("cranfield")
    with Timer() as timer:
        collection = ingest("cranfield", corpus, fresh=False)
    print(f"collection {collection}: {len(corpus)} documents (ready in {timer.seconds:.1f}s)")
    arguments = [
        {"query": query["text"], "collection": collection, "top_k": args.top_k} for query in queries[: args.queries]
    ]
    server, base = start_server()
    try:
        print(f"rag_search, hybrid, top_k {args.top_k}, {len(arguments)} queries; latency per call")
        print(f"  {'path':<20} {'clients':>7} {'p50 ms':>9} {'p95 ms':>9} {'calls/s':>8}")
        single = {
            "in-process search": row("in-process search", 1, *in_process(arguments, 1)),
            "SSE": row("SSE", 1, asyncio.run(client_latencies(sse_session, f"{base}/sse", arguments, 2)), 0.0),
            "Streamable HTTP": row(
                "Streamable HTTP", 1, asyncio.run(client_latencies(http_session, f"{base}/mcp", arguments, 2)), 0.0
            ),
        }
        row("in-process search", args.clients, *in_process(arguments, args.clients))
        row("SSE", args.clients, *asyncio.run(concurrent(sse_session, f"{base}/sse", arguments, args.clients)))
        row(
            "Streamable HTTP",
            args.clients,
            *asyncio.run(concurrent(http_session, f"{base}/mcp", arguments, args.clients)),
        )
        row("SSE ping", 1, asyncio.run(ping_latencies(sse_session, f"{base}/sse")), 0.0)
        row("Streamable HTTP ping", 1, asyncio.run(ping_latencies(http_session, f"{base}/mcp")), 0.0)
        baseline = single["in-process search"][1]
        overheads = ", ".join(f"{label} +{p50 - baseline:.1f} ms" for label, p50 in list(single.values())[1:])
        print(f"transport overhead at p50, one client: {overheads}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
