"""Time to searchable: how long an agent's write takes to be found by meaning, idle and during a
bulk import, with the interactive lane (`make run`: a worker for both lanes plus one for the
interactive lane alone) against the reference of a single worker for everything.

Each write is SciRAG's store_document_chunks over Streamable HTTP (the server waits until the chunk
is embedded, KB_WRITE_WAIT_SECONDS), followed at once by retrieve_document_chunks for the same text;
the time is from sending the write to the answer of the search that finds it. The bulk import is
`manage.py kb_ingest` of a shared corpus as files (DBpedia's 5,000 entities by default), started just
before the writes.

    .venv/bin/python bench/searchable.py [--writes 100] [--bulk 5000] [--corpus dbpedia]
"""

import argparse
import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent)
sys.path[:] = [entry for entry in sys.path if entry != BENCH]  # this folder holds an mcp.py
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

sys.path.insert(0, BENCH)
from common import ROOT, load_beir, percentile, setup_django  # noqa: E402

# bench/mcp.py (named like the SDK's package): its uvicorn, started as the launcher starts it.
_spec = importlib.util.spec_from_file_location("bench_mcp", Path(BENCH) / "mcp.py")
bench_mcp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_mcp)


def start_worker(name: str, queues: str | None) -> subprocess.Popen:
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel=WARNING", "--concurrency=1",
               "--without-gossip", "--without-mingle", f"--hostname={name}@%h", *(["-Q", queues] if queues else [])]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, start_new_session=True)


def start_bulk_import(folder: Path, collection: str) -> subprocess.Popen:
    command = [sys.executable, "manage.py", "kb_ingest", str(folder), "--collection", collection, "--create"]
    return subprocess.Popen(
        command, cwd=ROOT, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


async def writes(url: str, count: int, tag: str) -> tuple[list[float], int]:
    """Seconds from each write to the search that finds it; how many were found at once."""
    seconds, found = [], 0
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for n in range(count):
            text = f"Field note {tag}-{n}: the probe recorded boundary layer transition at station {n}."
            chunk = {"text": text, "source_filename": f"{tag}-{n}.txt", "chunk_index": 0}
            started = time.perf_counter()
            await session.call_tool("store_document_chunks", {"chunks": [chunk], "collection": "notes"})
            hits = await session.call_tool(
                "retrieve_document_chunks", {"query": text, "top_k": 1, "collection": "notes"}
            )
            seconds.append(time.perf_counter() - started)
            found += text in hits.content[0].text if hits.content else 0
    return seconds, found


def report(label: str, seconds: list[float], found: int) -> None:
    print(f"{label:<44} p50 {percentile(seconds, 0.5):6.2f} s   p95 {percentile(seconds, 0.95):6.2f} s   "
          f"found at once {found}/{len(seconds)}")  # fmt: skip


def bulk_progress(collection: str) -> tuple[int, int]:
    """Documents the import has stored so far, and how many of those still wait for embedding."""
    from kb.models import Document, DocumentStatus

    documents = Document.objects.filter(collection__name=collection)
    return documents.count(), documents.exclude(status=DocumentStatus.READY).count()


def during_bulk_import(label: str, url: str, folder: Path, count: int) -> None:
    collection = f"bulk{time.time():.0f}"
    importer = start_bulk_import(folder, collection)
    time.sleep(5)
    report(label, *asyncio.run(writes(url, count, collection)))
    stored, waiting = bulk_progress(collection)
    print(f"  (when the writes ended the import had stored {stored} documents, {waiting} still waiting to embed)")
    importer.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--bulk", type=int, default=5000, help="documents in each bulk import")
    parser.add_argument("--corpus", default="dbpedia", help="shared set the bulk import's files come from")
    args = parser.parse_args()
    os.environ.setdefault("KB_WRITE_WAIT_SECONDS", "120")
    setup_django()
    from kb.services.collections import collection_get_or_create

    collection_get_or_create(name="notes")
    corpus, _, _ = load_beir(args.corpus)
    server, base = bench_mcp.start_server()
    main_worker = start_worker("main", None)
    interactive = start_worker("interactive", "interactive")
    url = f"{base}/profiles/scirag/mcp"
    try:
        time.sleep(8)  # the workers load the embedder
        # Under the project folder: kb_ingest reads only under KB_FILE_ROOTS or its working directory.
        folder = ROOT / "var" / "bench" / "bulk-import"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for n, document in enumerate(corpus[: args.bulk]):  # ids may hold "/" (DBpedia's do)
            Path(folder, f"{n:05d}.txt").write_text(f"{document['title']}\n\n{document['text']}")
        report("idle, interactive lane", *asyncio.run(writes(url, args.writes, f"idle{time.time():.0f}")))

        during_bulk_import("during a bulk import, interactive lane", url, folder, args.writes)
        interactive.terminate()
        interactive.wait()
        during_bulk_import("reference: one worker, during a bulk import", url, folder, args.writes)
    finally:
        for process in (server, main_worker, interactive):
            process.terminate()
        for process in (server, main_worker, interactive):
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
