"""Heading context in the embedded text (KB_EMBED_HEADINGS): does it help retrieval?

Each shared BEIR set is rendered as Markdown, one document per corpus line (``# title`` over the
text), and chunked small (``--chunk-tokens``, default 64) so that most of a document's chunks lie
below its heading without repeating it, as in sectioned manuals and wikis. The same documents are
stored twice: embedded as they are, and embedded after their heading path (KB_EMBED_HEADINGS on).
Each judged query runs in semantic and hybrid mode with one result per document
(``group_by_document``); nDCG@10 and Recall@100 are printed for both, on the same chunks.

    .venv/bin/python bench/headings.py [--sets cranfield cisi dbpedia] [--chunk-tokens 64] [--fresh]
"""

import argparse
import sys

from common import Timer, load_beir, setup_django
from quality import DEPTH, measured


def ingest(name: str, corpus: list[dict], *, chunk_tokens: int, titled: bool, fresh: bool) -> str:
    from django.test import override_settings

    from kb.models import Collection, Document, DocumentStatus
    from kb.services.collections import collection_create, collection_delete
    from kb.services.documents import document_create_from_text
    from kb.services.embedding_pipeline import document_claim, document_embed

    collection_name = f"sections-{name}-{chunk_tokens}-{'titled' if titled else 'plain'}"
    if fresh and Collection.objects.filter(name=collection_name).exists():
        collection_delete(name=collection_name, confirm=True)
    collection = Collection.objects.filter(name=collection_name).first() or collection_create(
        name=collection_name, chunk_max_tokens=chunk_tokens, chunk_min_tokens=0
    )
    texts = {row["_id"]: (row.get("title", "").strip(), row["text"].strip()) for row in corpus if row["text"].strip()}
    if Document.objects.filter(collection=collection, status=DocumentStatus.READY).count() == len(texts):
        return collection_name
    with Timer() as store_timer:
        for doc_id, (title, text) in texts.items():
            markdown = f"# {title}\n\n{text}\n" if title else f"{text}\n"
            document_create_from_text(
                collection=collection, source_uri=f"beir://{name}/{doc_id}", text=markdown, content_type="markdown"
            )
    with Timer() as embed_timer, override_settings(KB_EMBED_HEADINGS=titled):
        pending = Document.objects.filter(collection=collection).exclude(status=DocumentStatus.READY)
        for doc_id in pending.values_list("pk", flat=True):
            document_claim(doc_id=doc_id)
            document_embed(doc_id=doc_id)
    print(f"  {collection_name}: stored in {store_timer.seconds:.1f}s, embedded in {embed_timer.seconds:.1f}s")
    return collection_name


def evaluate(collection: str, queries: list[dict], mode: str) -> dict[str, list[str]]:
    from kb.search import search

    runs = {}
    for query in queries:
        response = search(query=query["text"], collections=[collection], top_k=DEPTH, mode=mode, group_by_document=True)
        runs[query["_id"]] = [result.source_uri.rsplit("/", 1)[1] for result in response.results]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["cranfield", "cisi", "dbpedia"])
    parser.add_argument("--chunk-tokens", type=int, default=64)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args()
    setup_django()
    from kb.models import Chunk

    print("| set | chunks below their heading | mode | embedded as is | after the heading path | change |")
    print("|---|---|---|---|---|---|")
    for name in args.sets:
        corpus, queries, qrels = load_beir(name)
        queries = [query for query in queries if query["_id"] in qrels]
        plain = ingest(name, corpus, chunk_tokens=args.chunk_tokens, titled=False, fresh=args.fresh)
        titled = ingest(name, corpus, chunk_tokens=args.chunk_tokens, titled=True, fresh=args.fresh)
        chunks = Chunk.objects.filter(collection__name=plain)
        below = chunks.exclude(content__startswith="# ").exclude(heading_path=[]).count() / chunks.count()
        for mode in ("semantic", "hybrid"):
            (before, before_recall), (after, after_recall) = (
                measured(evaluate(collection, queries, mode), qrels) for collection in (plain, titled)
            )
            print(
                f"| {name} | {below:.0%} | {mode} | {before:.3f} ({before_recall:.3f}) "
                f"| {after:.3f} ({after_recall:.3f}) | {after - before:+.3f} |"
            )


if __name__ == "__main__":
    sys.exit(main())
