"""Ingestion throughput with the local provider, phase by phase.

Two inputs: the Cranfield corpus (1,400 short abstracts, one document per line) and a folder of
mixed files (Markdown, reStructuredText and Python sources taken from the installed packages,
plus generated HTML, PDF and DOCX files). Each phase runs the same functions the ingestion
service runs, timed separately:

- parse + chunk: format detection, parsing, structure-aware chunking (in the request);
- store: documents, chunks and BM25 postings in one transaction per document (bulk inserts);
- embed: all-MiniLM-L6-v2 on the CPU, in batches of EMBEDDING_BATCH_SIZE (in the worker);
- store vectors: bulk insert of the vectors (in the worker).

    .venv/bin/python bench/ingest.py [--mixed-files 150]
"""

import argparse
import random
import sys
import tempfile
from pathlib import Path

from common import ROOT, Timer, load_beir, setup_django

SITE_PACKAGES = ROOT / ".venv" / "lib" / "python3.11" / "site-packages"


def mixed_folder(root: Path, count: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.support.documents import make_docx, make_pdf

    rng = random.Random(3)
    texts = sorted(
        p for p in SITE_PACKAGES.rglob("*") if p.suffix in (".md", ".rst") and 2_000 < p.stat().st_size < 60_000
    )
    code = sorted(p for p in SITE_PACKAGES.rglob("*.py") if 2_000 < p.stat().st_size < 60_000)
    rng.shuffle(texts)
    rng.shuffle(code)
    per_kind = count // 5
    for n, path in enumerate(texts[:per_kind]):
        (root / f"doc{n}{path.suffix}").write_bytes(path.read_bytes())
    for n, path in enumerate(code[:per_kind]):
        (root / f"code{n}.py").write_bytes(path.read_bytes())
    for n, path in enumerate(texts[per_kind : 2 * per_kind]):
        paragraphs = "".join(
            f"<p>{line}</p>\n" for line in path.read_text(errors="replace").split("\n\n") if line.strip()
        )
        page = f"<!doctype html><html><head><title>Page {n}</title></head><body><nav>Home | Docs</nav><article>{paragraphs}</article></body></html>"
        (root / f"page{n}.html").write_text(page)
    for n, path in enumerate(texts[2 * per_kind : 3 * per_kind]):
        lines = [line[:90] for line in path.read_text(errors="replace").splitlines() if line.strip()]
        pages = ["\n".join(lines[i : i + 40]) for i in range(0, min(len(lines), 200), 40)]
        pages = [page.encode("latin-1", "replace").decode("latin-1") for page in pages] or ["empty"]
        (root / f"paper{n}.pdf").write_bytes(make_pdf(pages, title=f"Paper {n}", author="Bench"))
    for n, path in enumerate(texts[3 * per_kind : 4 * per_kind]):
        paragraphs = [part.strip() for part in path.read_text(errors="replace").split("\n\n") if part.strip()][:60]
        (root / f"report{n}.docx").write_bytes(
            make_docx(title=f"Report {n}", heading="Body", paragraphs=paragraphs or ["empty"])
        )
    return root


def run(label: str, sources, collection_name: str) -> dict[str, float]:
    """sources: list of (source_uri, data bytes, filename)."""
    from kb.embedding_providers import embed_texts
    from kb.ingestion.chunking import chunk_text
    from kb.ingestion.formats import detect_content_type, parse
    from kb.ingestion.sources import source_hash
    from kb.models import Chunk, Collection, Document, DocumentStatus
    from kb.services.collections import collection_create, collection_delete
    from kb.services.documents import chunk_settings_of, document_save
    from kb.services.embedding_pipeline import insert_vectors

    if Collection.objects.filter(name=collection_name).exists():
        collection_delete(name=collection_name, confirm=True)
    collection = collection_create(name=collection_name)
    settings = chunk_settings_of(collection)
    prepared = []
    failures = 0
    with Timer() as parse_timer:
        for uri, data, filename in sources:
            try:
                kind = detect_content_type(data=data, filename=filename)
                parsed = parse(data, content_type=kind, filename=filename)
                drafts = chunk_text(
                    parsed.text, content_type=parsed.content_type, settings=settings, pages=parsed.pages
                )
            except Exception:  # noqa: BLE001 - counted, as the service would report it
                failures += 1
                continue
            prepared.append((uri, data, kind, parsed, drafts))
    with Timer() as store_timer:
        for uri, data, kind, parsed, drafts in prepared:
            document_save(
                collection=collection,
                source_uri=uri,
                parsed=parsed,
                source_hash=source_hash(data, kind),
                size_bytes=len(data),
                drafts=drafts,
            )
    chunks = list(Chunk.objects.filter(collection=collection).order_by("id").values_list("id", "content"))
    model = collection.embedding_model
    with Timer() as embed_timer:
        vectors = embed_texts(model.provider, model.name, [content for _, content in chunks])
    with Timer() as vector_timer:
        for start in range(0, len(chunks), 1000):
            insert_vectors(
                model, [chunk_id for chunk_id, _ in chunks[start : start + 1000]], vectors[start : start + 1000]
            )
    Document.objects.filter(collection=collection).update(status=DocumentStatus.READY, embedded_count=1)
    documents, total_chunks = len(prepared), len(chunks)
    print(f"{label}: {documents} documents, {total_chunks} chunks, {failures} refused")
    figures = {}
    for phase, seconds in (
        ("parse + chunk", parse_timer.seconds),
        ("store (documents, chunks, postings)", store_timer.seconds),
        ("embed (local model)", embed_timer.seconds),
        ("store vectors", vector_timer.seconds),
    ):
        figures[phase] = seconds
        print(
            f"  {phase:<38} {seconds:7.1f} s  {documents / seconds:8.1f} docs/s  {total_chunks / seconds:8.1f} chunks/s"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixed-files", type=int, default=150)
    args = parser.parse_args()
    setup_django()
    corpus, _, _ = load_beir("cranfield")
    cranfield = [
        (f"beir://cranfield/{row['_id']}", f"{row.get('title', '')}\n\n{row['text']}".strip().encode(), "abstract.txt")
        for row in corpus
        if row["text"].strip()
    ]
    run("cranfield", cranfield, "bench-ingest-cranfield")
    with tempfile.TemporaryDirectory() as folder:
        root = mixed_folder(Path(folder), args.mixed_files)
        files = sorted(root.iterdir())
        run("mixed folder", [(path.as_uri(), path.read_bytes(), path.name) for path in files], "bench-ingest-mixed")


if __name__ == "__main__":
    main()
