"""Many MCP clients at once for a minute (issue 18, items 3 and 4): throughput, latency and the web
process's memory and threads, during the load and after it.

By default the whole system is started as a user would (`manage.py kb_run` on a free port, on the
data of var/bench-load: embedded Postgres, both Celery workers, uvicorn) and stopped with Ctrl-C's
SIGINT at the end; `--url` targets a server that is already running instead. The collection
"load" is seeded once with the Cranfield corpus over the REST API (uploads, 100 files a request)
and the benchmark waits until every document is embedded; a later run finds it and skips this.

Then N clients (half the SDK's Streamable HTTP client on /mcp, half its SSE client on /sse), each
one session, loop for the given seconds: with probability 0.9 rag_search in "load" (hybrid, the
collection's top_k of 10) of a random Cranfield query with 1-3 of its words left out, so that
nearly every query is new and is embedded as an agent's would be (`--repeat-queries`: the queries
as they are, which the query cache then answers), otherwise rag_ingest of a small unique
note as a data: URI into "load-notes" (so the searched corpus stays the same from run to run;
rag_ingest answers once the note is embedded, at most KB_WRITE_WAIT_SECONDS). A call that raises,
or answers isError, is an error; the first distinct error texts are printed. A client whose
session broke opens a new one. Calls in flight at the deadline are finished and counted.

The web (uvicorn) process's RSS and thread count are sampled when the server answers, before the
load (after seeding and a warm-up search and ingest), every 5 s during it, at its end, and after
`--idle` seconds without calls; the workers' RSS is shown for information. CPU seconds used by
the web process, the workers, this load generator and the whole machine (2 cores here, shared
with Postgres and anything else running) tell whether the load generator or something else was
the limit. Before the load it waits (up to 5 minutes) until the machine is nearly idle, so that
what an earlier run left behind (a worker still embedding notes) does not count against this one.

`--soak 600` repeats the load in rounds of `--seconds` (new sessions each round) for that long and
prints the RSS after each round, so one can see whether it keeps growing or stays flat.

    .venv/bin/python bench/load.py [--clients 50] [--seconds 60] [--idle 30] [--soak 0] [--repeat-queries]
        [--url http://127.0.0.1:8001] [--var-dir var/bench-load] [--env MALLOC_ARENA_MAX=2 ...]
"""

import argparse
import asyncio
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

# This folder holds an mcp.py: find the SDK without it on the path.
BENCH = str(Path(__file__).resolve().parent)
sys.path[:] = [entry for entry in sys.path if entry != BENCH]
from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

sys.path.insert(0, BENCH)
from common import ROOT, load_beir, percentile  # noqa: E402

COLLECTION = "load"
NOTES = "load-notes"
UPLOAD_BATCH = 100  # DATA_UPLOAD_MAX_NUMBER_FILES
SAMPLE_SECONDS = 5.0
CALL_TIMEOUT_SECONDS = 120.0
MB = 1024 * 1024
QUIET_CORES = 0.15


@dataclass
class Call:
    kind: str  # "search" or "ingest"
    transport: str  # "http" or "sse"
    seconds: float
    error: str | None = None
    note: bool = False  # an ingest that answered before its note was embedded


@dataclass(eq=False)
class Sample:
    label: str
    rss: int
    threads: int
    workers: list[tuple[str, int]] = field(default_factory=list)  # (which, RSS)


@dataclass
class Round:
    calls: list[Call]
    wall: float
    session_errors: list[str]


class System:
    """The server under test: launched here (kb_run) or found by the port of --url."""

    def __init__(self, url: str | None, var_dir: Path, extra_env: dict[str, str]) -> None:
        self.launcher: subprocess.Popen[bytes] | None = None
        self.var_dir = var_dir
        if url:
            self.base = url.rstrip("/")
        else:
            self.base = self._launch(extra_env)
        self._web: psutil.Process | None = None

    def _launch(self, extra_env: dict[str, str]) -> str:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "KB_EMBEDDED_DATABASE")}
        env.update(
            KB_VAR_DIR=str(self.var_dir),
            DJANGO_SUPERUSER_USERNAME="bench",
            DJANGO_SUPERUSER_PASSWORD="a-long-bench-password",
            PYTHONUNBUFFERED="1",
            **extra_env,
        )
        self.var_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.var_dir / "load-launcher.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the launcher
        command = [sys.executable, "manage.py", "kb_run", "--port", str(port)]
        self.launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        return f"http://127.0.0.1:{port}"

    def wait_ready(self, timeout: float = 300) -> None:
        """Until /health/ready says 200: database, broker and a worker on every queue (/health on
        builds that have no /health/ready, such as 2fdb586, the build issue 18 measured)."""
        deadline = time.monotonic() + timeout
        path = "/health/ready"
        while time.monotonic() < deadline:
            if self.launcher is not None and self.launcher.poll() is not None:
                raise SystemExit(f"kb_run exited with status {self.launcher.returncode}: see {self.log_path}")
            with suppress(httpx.HTTPError):
                status = httpx.get(f"{self.base}{path}", timeout=5).status_code
                if status == 200:
                    return
                if status == 404:
                    path = "/health"
            time.sleep(0.5)
        raise SystemExit(f"{self.base}{path} did not answer 200 in {timeout:.0f} s")

    def web(self) -> psutil.Process | None:
        if self._web is not None and self._web.is_running():
            return self._web
        port = urllib.parse.urlsplit(self.base).port
        if self.launcher is not None:
            candidates = psutil.Process(self.launcher.pid).children(recursive=True)
            self._web = next((p for p in candidates if "uvicorn" in " ".join(p.cmdline())), None)
        else:
            with suppress(psutil.AccessDenied):
                listening = [
                    c.pid
                    for c in psutil.net_connections("tcp")
                    if c.status == psutil.CONN_LISTEN and c.laddr.port == port
                ]
                self._web = psutil.Process(listening[0]) if listening else None
        return self._web

    def workers(self) -> list[psutil.Process]:
        """The Celery processes next to the web process (children of the same launcher)."""
        web = self.web()
        parent = psutil.Process(self.launcher.pid) if self.launcher else (web.parent() if web else None)
        if parent is None:
            return []
        with suppress(psutil.Error):
            return [p for p in parent.children(recursive=True) if "celery" in " ".join(p.cmdline())]
        return []

    def sample(self, label: str) -> Sample:
        web = self.web()
        workers = []
        for worker in self.workers():
            with suppress(psutil.Error):
                lane = "interactive" if "interactive" in " ".join(worker.cmdline()) else "worker"
                role = " pool" if "celery" in " ".join(worker.parent().cmdline()) else ""
                workers.append((lane + role, worker.memory_info().rss))
        if web is None:
            return Sample(label, 0, 0, workers)
        return Sample(label, web.memory_info().rss, web.num_threads(), workers)

    def stop(self) -> None:
        if self.launcher is None:
            return
        self.launcher.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            self.launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"kb_run did not stop in 60 s; killing it (see {self.log_path})")
            self.launcher.kill()
            self.launcher.wait()


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """CPU used so far by these processes and, for a parent such as the postmaster, by its children
    that have ended (the live ones are listed among the processes themselves). Between two readings,
    list the processes again: Postgres starts a backend for a new connection, whose CPU the first
    list would miss, and one that ended since has moved into its parent's figure, whole."""
    total = 0.0
    for process in processes:
        with suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def postgres_processes(var_dir: Path) -> list[psutil.Process]:
    """The embedded Postgres of this var dir: its postmaster and every backend (none with --url
    and a database elsewhere)."""
    with suppress(OSError, ValueError, psutil.Error):
        postmaster = psutil.Process(int((var_dir / "pgdata" / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]
    return []


def machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def wait_until_quiet(most_seconds: float = 300.0) -> float:
    """Wait until the machine has been nearly idle for 3 s (at most ``most_seconds``), so that
    work left by an earlier run (another build's worker still embedding its notes) is not counted
    against this one; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < most_seconds:
        busy = machine_busy_seconds()
        time.sleep(3.0)
        if (machine_busy_seconds() - busy) / 3.0 < QUIET_CORES:
            break
    return time.monotonic() - started


def seed_collection(api: httpx.Client, corpus: list[dict]) -> None:
    """Collection "load" with every non-empty Cranfield document, embedded; "load-notes" for the notes."""
    for name in (COLLECTION, NOTES):
        if api.get(f"/collections/{name}").status_code == 404:
            api.post("/collections", json={"name": name, "description": "bench/load.py"}).raise_for_status()
    texts = {row["_id"]: f"{row.get('title', '')}\n\n{row['text']}".strip() for row in corpus}
    texts = {doc_id: text for doc_id, text in texts.items() if text}
    stats = api.get("/stats", params={"collection": COLLECTION}).json()
    if stats["documents"] >= len(texts) and stats["pending"] + stats["processing"] == 0:
        print(f"collection {COLLECTION}: {stats['documents']} documents, {stats['chunks']} chunks (seeded before)")
        return
    started = time.perf_counter()
    items = sorted(texts.items())
    for offset in range(0, len(items), UPLOAD_BATCH):
        files = [
            ("files", (f"cranfield-{doc_id}.txt", text.encode(), "text/plain"))
            for doc_id, text in items[offset : offset + UPLOAD_BATCH]
        ]
        api.post(f"/collections/{COLLECTION}/uploads", files=files).raise_for_status()
    uploaded = time.perf_counter() - started
    while True:
        stats = api.get("/stats", params={"collection": COLLECTION}).json()
        if stats["pending"] + stats["processing"] == 0:
            break
        time.sleep(2)
    print(
        f"collection {COLLECTION}: seeded {len(texts)} documents, {stats['chunks']} chunks "
        f"(uploads {uploaded:.0f} s, embedded after {time.perf_counter() - started:.0f} s, failed {stats['failed']})"
    )


@asynccontextmanager
async def session(transport: str, base: str) -> AsyncIterator[ClientSession]:
    client = streamable_http_client(f"{base}/mcp") if transport == "http" else sse_client(f"{base}/sse")
    async with client as streams, ClientSession(streams[0], streams[1]) as mcp_session:
        await mcp_session.initialize()
        yield mcp_session


def search_query(rng: random.Random, queries: list[dict], repeat: bool) -> str:
    """A Cranfield query, or by default one with 1-3 of its words left out: an agent rarely asks the
    same thing twice, so the query cache must not answer most searches (each query is embedded)."""
    words = rng.choice(queries)["text"].split()
    if repeat or len(words) < 5:
        return " ".join(words)
    for _ in range(rng.randint(1, 3)):
        words.pop(rng.randrange(len(words)))
    return " ".join(words)


def note_arguments(rng: random.Random, queries: list[dict]) -> dict:
    text = f"# Load note {uuid.uuid4().hex}\n\nAn agent's note while reading about {rng.choice(queries)['text']}\n"
    return {"uri": "data:text/markdown," + urllib.parse.quote(text), "collection": NOTES}


async def one_call(mcp_session: ClientSession, kind: str, arguments: dict, transport: str) -> Call:
    tool = "rag_search" if kind == "search" else "rag_ingest"
    started = time.perf_counter()
    result = await mcp_session.call_tool(tool, arguments, read_timeout_seconds=CALL_TIMEOUT_SECONDS)
    seconds = time.perf_counter() - started
    if getattr(result, "is_error", False):
        content = getattr(result, "content", None) or []
        return Call(kind, transport, seconds, f"{tool}: {getattr(content[0], 'text', content[0]) if content else '?'}")
    structured = getattr(result, "structured_content", None) or {}
    return Call(kind, transport, seconds, note=bool(structured.get("note")))


async def client(
    number: int,
    base: str,
    deadline: float,
    queries: list[dict],
    ingest_share: float,
    out: Round,
    seed: int,
    repeat_queries: bool,
) -> None:
    transport = "http" if number % 2 == 0 else "sse"
    rng = random.Random(seed * 1000 + number)
    while time.monotonic() < deadline:
        try:
            async with session(transport, base) as mcp_session:
                while time.monotonic() < deadline:
                    kind = "ingest" if rng.random() < ingest_share else "search"
                    if kind == "search":
                        arguments = {"query": search_query(rng, queries, repeat_queries), "collection": COLLECTION}
                    else:
                        arguments = note_arguments(rng, queries)
                    started = time.perf_counter()
                    try:
                        out.calls.append(await one_call(mcp_session, kind, arguments, transport))
                    except Exception as exc:  # noqa: BLE001 - every failure is a figure
                        error = f"{type(exc).__name__}: {exc}"
                        out.calls.append(Call(kind, transport, time.perf_counter() - started, error))
                        break  # the session may be broken: open a new one
        except Exception as exc:  # noqa: BLE001 - opening or closing a session
            out.session_errors.append(f"{transport}: {type(exc).__name__}: {exc}")
            await asyncio.sleep(1)


async def run_round(
    system: System,
    clients: int,
    seconds: float,
    queries: list[dict],
    ingest_share: float,
    seed: int,
    samples: list,
    label: str,
    repeat_queries: bool,
) -> Round:
    out = Round(calls=[], wall=0.0, session_errors=[])
    started = time.monotonic()
    deadline = started + seconds
    tasks = [
        asyncio.create_task(client(n, system.base, deadline, queries, ingest_share, out, seed, repeat_queries))
        for n in range(clients)
    ]
    while not all(task.done() for task in tasks):
        await asyncio.wait(tasks, timeout=SAMPLE_SECONDS)
        if not all(task.done() for task in tasks):
            samples.append(system.sample(f"{label} t={time.monotonic() - started:.0f}s calls={len(out.calls)}"))
    out.wall = time.monotonic() - started
    return out


def latency_line(label: str, calls: list[Call]) -> str:
    if not calls:
        return f"  {label:<8} no calls"
    ms = [call.seconds * 1000 for call in calls]
    p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
    return (
        f"  {label:<8} {len(calls):>6} calls  p50 {p50:7.0f}  p95 {percentile(ms, 0.95):7.0f}  "
        f"p99 {p99:7.0f}  max {max(ms):7.0f} ms  p99/p50 {p99 / p50:5.1f}"
    )


def report_errors(calls: list[Call], session_errors: list[str]) -> None:
    errors = Counter(call.error for call in calls if call.error)
    print(
        f"errors: {sum(errors.values())} of {len(calls)} calls; sessions that failed to open or close: {len(session_errors)}"
    )
    for text, count in errors.most_common(5):
        print(f"  {count} x {text[:300]}")
    for text, count in Counter(session_errors).most_common(3):
        print(f"  session, {count} x {text[:300]}")


def mb(value: int) -> str:
    return f"{value / MB:.0f} MB"


def workers_text(sample: Sample) -> str:
    return ", ".join(f"{which} {rss / MB:.0f}" for which, rss in sorted(sample.workers)) or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50, help="half Streamable HTTP, half SSE")
    parser.add_argument("--seconds", type=float, default=60, help="length of the load (of each round with --soak)")
    parser.add_argument("--soak", type=float, default=0, help="repeat the load in rounds for this many seconds")
    parser.add_argument("--idle", type=float, default=30, help="seconds without calls before the last sample")
    parser.add_argument("--ingest-share", type=float, default=0.1, help="share of calls that are rag_ingest")
    parser.add_argument("--url", help="a running server (no start, no stop), e.g. http://127.0.0.1:8001")
    parser.add_argument("--var-dir", type=Path, default=ROOT / "var" / "bench-load", help="KB_VAR_DIR of kb_run")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for the launched system")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat-queries",
        action="store_true",
        help="search Cranfield's 225 queries as they are, so that the query cache answers most (the old default)",
    )
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)

    corpus, queries, _ = load_beir("cranfield")
    system = System(args.url, args.var_dir.resolve(), extra_env)
    print(
        f"server {system.base}" + (f" (kb_run, KB_VAR_DIR={system.var_dir}, env {extra_env})" if not args.url else "")
    )
    try:
        system.wait_ready()
        if system.web() is None:
            print("the web process was not found: no RSS figures")
        samples = [system.sample("server ready")]
        with httpx.Client(base_url=f"{system.base}/api", timeout=600) as api:
            seed_collection(api, corpus)

        async def warm_up() -> None:
            async with session("http", system.base) as mcp_session:
                for kind, arguments in (
                    ("search", {"query": queries[0]["text"], "collection": COLLECTION}),
                    ("ingest", note_arguments(random.Random(args.seed), queries)),
                ):
                    call = await one_call(mcp_session, kind, arguments, "http")
                    if call.error:
                        raise SystemExit(f"warm-up failed: {call.error}")

        asyncio.run(warm_up())
        samples.append(system.sample("before load"))
        rounds = max(1, math.ceil(args.soak / args.seconds)) if args.soak else 1
        web, me = system.web(), psutil.Process()
        processes = {  # listed again at the end (cpu_seconds)
            "web": lambda: [web] if web else [],
            "workers": system.workers,
            "Postgres": lambda: postgres_processes(system.var_dir),
            "load generator": lambda: [me],
        }
        waited = wait_until_quiet()
        cpu_before = {name: cpu_seconds(listed()) for name, listed in processes.items()}
        busy_before = machine_busy_seconds()
        print(f"waited {waited:.0f} s for the machine to be quiet (under {QUIET_CORES} cores busy for 3 s)")
        print(f"load average before the load: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
        print(
            f"\n{args.clients} clients ({(args.clients + 1) // 2} Streamable HTTP, {args.clients // 2} SSE), "
            f"{args.ingest_share:.0%} rag_ingest, {rounds} round(s) of {args.seconds:.0f} s, "
            + ("Cranfield's queries as they are" if args.repeat_queries else "queries with 1-3 words left out")
        )
        all_calls: list[Call] = []
        session_errors: list[str] = []
        wall = 0.0
        for number in range(1, rounds + 1):
            during: list[Sample] = []
            result = asyncio.run(
                run_round(
                    system,
                    args.clients,
                    args.seconds,
                    queries,
                    args.ingest_share,
                    args.seed + number,
                    during,
                    f"round {number}",
                    args.repeat_queries,
                )
            )
            end = system.sample(f"end of round {number}")
            all_calls += result.calls
            session_errors += result.session_errors
            wall += result.wall
            samples += [*during, end]
            if rounds == 1:
                for sample in during:
                    print(f"  {sample.label:<22} web RSS {mb(sample.rss):>7}  threads {sample.threads}")
            ms = [call.seconds * 1000 for call in result.calls] or [0.0]
            print(
                f"  round {number:>2}: {len(result.calls):>5} calls {len(result.calls) / result.wall:6.1f}/s  "
                f"errors {sum(1 for c in result.calls if c.error):>3}  p50 {percentile(ms, 0.5):6.0f} ms  "
                f"p99 {percentile(ms, 0.99):6.0f} ms  web RSS {mb(end.rss):>7} (peak {mb(max(s.rss for s in [*during, end]))})"
                f"  threads {end.threads}"
            )
        cpu = {name: cpu_seconds(listed()) - cpu_before[name] for name, listed in processes.items()}
        busy = machine_busy_seconds() - busy_before
        time.sleep(args.idle)
        samples.append(system.sample(f"after {args.idle:.0f} s idle"))
    finally:
        system.stop()

    searches = [call for call in all_calls if call.kind == "search"]
    ingests = [call for call in all_calls if call.kind == "ingest"]
    print(f"\ncalls: {len(all_calls)} in {wall:.1f} s: {len(all_calls) / wall:.1f} calls/s")
    report_errors(all_calls, session_errors)
    print("latency per call (ms):")
    print(latency_line("all", all_calls))
    print(latency_line("search", searches))
    print(latency_line("ingest", ingests))
    for transport, label in (("http", "HTTP"), ("sse", "SSE")):
        print(latency_line(label, [call for call in all_calls if call.transport == transport]))
    notes = sum(1 for call in ingests if call.note)
    print(f"ingests answered before their note was embedded (note): {notes} of {len(ingests)}")
    print(
        f"CPU during the load ({wall:.0f} s, {psutil.cpu_count()} cores): machine busy {busy / wall:.2f} cores; "
        + ", ".join(f"{name} {seconds / wall:.2f}" for name, seconds in cpu.items())
        + f", the rest (other work) {(busy - sum(cpu.values())) / wall:.2f}"
    )
    print(
        "CPU per call (ms): "
        + ", ".join(f"{name} {seconds * 1000 / max(1, len(all_calls)):.1f}" for name, seconds in cpu.items())
    )
    # The load generator does the same work per call for every build, so its CPU per call tracks the
    # machine's speed, which moves by a quarter between runs here (README, Many clients at once):
    # calls/s times it compares builds with the speed taken out.
    print(f"calls/s x the load generator's CPU per call (ms): {cpu['load generator'] * 1000 / wall:.0f}")
    print("web process (uvicorn):")
    peak = max(samples[2:-1], key=lambda sample: sample.rss)
    for sample in dict.fromkeys([samples[0], samples[1], peak, samples[-2], samples[-1]]):
        label = f"peak ({sample.label})" if sample is peak else sample.label
        print(
            f"  {label:<36} RSS {mb(sample.rss):>7}  threads {sample.threads:>3}  workers (MB): {workers_text(sample)}"
        )
    ready, before, last, idle = samples[0], samples[1], samples[-2], samples[-1]
    print(
        f"RSS growth over the load: {(last.rss - before.rss) / MB:+.0f} MB at its end, {(idle.rss - before.rss) / MB:+.0f} MB "
        f"after idle (from server ready: {(idle.rss - ready.rss) / MB:+.0f} MB); threads {before.threads} -> {last.threads} "
        f"-> {idle.threads}"
    )


if __name__ == "__main__":
    main()
