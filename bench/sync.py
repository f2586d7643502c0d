"""Sync of a source: a folder of 1,000 files synced once, then again after 10 files changed, 5 were
added and 5 deleted, through the same service the worker's task runs (scan, hash, parse, chunk,
store, remove), followed by embedding what is new with the local model as the worker would.

The files are real text available offline: Markdown, reStructuredText and Python sources of the
installed packages (1-30 KB each). Prints both syncs' times, with and without embedding, their
ratio, and the second run's counts.

    .venv/bin/python bench/sync.py [--files 1000]
"""

import argparse
import os
import random
import shutil
from pathlib import Path

from common import ROOT, Timer

SITE_PACKAGES = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"
FOLDER = ROOT / "var" / "bench" / "sync-folder"
os.environ["KB_FILE_ROOTS"] = str(FOLDER)


def make_folder(count: int) -> list[Path]:
    """``count`` text files copied into FOLDER (in subfolders of 100); the spare ones are returned."""
    candidates = sorted(
        path
        for path in SITE_PACKAGES.rglob("*")
        if path.suffix in (".md", ".rst", ".py") and path.is_file() and 1_000 < path.stat().st_size < 30_000
    )
    random.Random(5).shuffle(candidates)
    shutil.rmtree(FOLDER, ignore_errors=True)
    for n, path in enumerate(candidates[:count]):
        target = FOLDER / f"part{n // 100}" / f"file{n}{path.suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return candidates[count : count + 5]


def change_folder(spares: list[Path]) -> None:
    files = sorted(FOLDER.rglob("*.*"))
    rng = random.Random(9)
    picked = rng.sample(files, 15)
    for path in picked[:10]:
        path.write_text(path.read_text(errors="replace") + f"\n\nA line added to {path.name} for the resync.\n")
    for path in picked[10:]:
        path.unlink()
    for n, spare in enumerate(spares):
        (FOLDER / "new" / f"added{n}{spare.suffix}").parent.mkdir(exist_ok=True)
        (FOLDER / "new" / f"added{n}{spare.suffix}").write_bytes(spare.read_bytes())


def sync_and_embed(source) -> tuple[float, float, object]:
    """Seconds of the sync job, seconds of embedding what it left pending, and the run."""
    from kb.models import Document, DocumentStatus
    from kb.services.embedding_pipeline import document_claim, document_embed
    from kb.services.sources import sync_execute, sync_start

    with Timer() as sync_timer:
        run = sync_execute(run_id=sync_start(source=source).run.pk)
    pending = Document.objects.filter(collection=source.collection, status=DocumentStatus.PENDING)
    with Timer() as embed_timer:
        for doc_id in list(pending.values_list("pk", flat=True)):
            if document_claim(doc_id=doc_id):
                document_embed(doc_id=doc_id)
    return sync_timer.seconds, embed_timer.seconds, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    spares = make_folder(args.files)
    from common import setup_django

    setup_django()
    from kb.models import Chunk, Collection
    from kb.selectors.sources import SyncRunOut
    from kb.services.collections import collection_create, collection_delete
    from kb.services.sources import source_create

    if Collection.objects.filter(name="sync-bench").exists():
        collection_delete(name="sync-bench", confirm=True)
    collection = collection_create(name="sync-bench")
    source = source_create(collection=collection, name="sync-bench", folder=str(FOLDER))
    first_sync, first_embed, first = sync_and_embed(source)
    chunks = Chunk.objects.filter(collection=collection).count()
    print(f"first sync: {SyncRunOut.of(first).summary}; {chunks} chunks")
    change_folder(spares)
    second_sync, second_embed, second = sync_and_embed(source)
    print(f"resync:     {SyncRunOut.of(second).summary}")
    print("\n| run | sync job (scan, hash, parse, chunk, store, remove) | embedding | total |")
    print("|---|---|---|---|")
    print(
        f"| first sync, {args.files} files | {first_sync:.1f} s | {first_embed:.1f} s | {first_sync + first_embed:.1f} s |"
    )
    print(f"| resync: 10 changed, 5 added, 5 deleted | {second_sync:.1f} s | {second_embed:.1f} s "
          f"| {second_sync + second_embed:.1f} s |")  # fmt: skip
    print(
        f"| resync / first | {second_sync / first_sync:.1%} | {second_embed / first_embed:.1%} "
        f"| {(second_sync + second_embed) / (first_sync + first_embed):.1%} |"
    )


if __name__ == "__main__":
    main()
