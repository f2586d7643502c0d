"""How the default fusion holds when the semantic half is the weak one (issue 14, held-out sets).

The shared sets have no collection where BM25 is far ahead of dense search (BEIR's Touché-2020
and TREC-COVID are such). This makes one: each query's vector is moved by Gaussian noise of
growing size (sigma, fixed seed), which lowers semantic nDCG@10 step by step while the keyword
half stays as it is. For every step it prints nDCG@10 of keyword, semantic, hybrid as the search
service fuses by default (convex, w = KB_SEMANTIC_WEIGHT's default 0.7, over each half's top
100 with both scores known) and the RRF reference (k 60, equal weights), then hybrid minus the
better half and minus RRF: issue 14's acceptance wants both >= -0.005.

In memory, to be quick: bm25s' tokens (English stemmer and stop words) with k1 1.5, b 0.75 and
Lucene's idf (the service's BM25 formula; ``full_match`` as kb.search.bm25 computes it), one
vector per document from the packaged all-MiniLM-L6-v2. Its sigma 0 row is close to, not equal
to, bench/quality.py's service figures. Document vectors are kept in var/bench-fusion.

    .venv/bin/python bench/fusion_stress.py [--sets cranfield cisi dbpedia] [--sigmas 0 1 2 3 4]
"""

import argparse
import math
from collections import Counter
from pathlib import Path

import numpy as np

from bench.common import load_beir, ndcg_at, setup_django

CACHE = Path(__file__).resolve().parent.parent / "var" / "bench-fusion"
DEPTH = 100
WEIGHT = 0.7
RRF_K = 60


def document_texts(corpus: list[dict]) -> list[str]:
    return [f"{row.get('title', '')} {row['text']}" for row in corpus]


def keyword_half(corpus: list[dict], queries: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """BM25 of every document for every query, and each query's full-match scale (the sum of its
    terms' idf: a score of one occurrence of each in a document of average length, times k1 + 1)."""
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")
    texts = document_texts(corpus)
    index = bm25s.BM25(k1=1.5, b=0.75)
    index.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False)
    frequency = Counter(term for document in tokens for term in set(document))
    total = len(corpus)
    scores, full_match = [], []
    for query in queries:
        terms = bm25s.tokenize([query["text"]], stopwords="en", stemmer=stemmer, show_progress=False, return_ids=False)
        terms = [term for term in terms[0] if term in frequency]
        scores.append(index.get_scores(terms) if terms else np.zeros(total))
        full_match.append(sum(math.log(1 + (total - frequency[t] + 0.5) / (frequency[t] + 0.5)) for t in terms))
    return np.array(scores), np.array(full_match)


def document_vectors(name: str, corpus: list[dict]) -> np.ndarray:
    from kb.embedding_providers import PACKAGED_MODEL, OnnxMiniLMEmbedder

    path = CACHE / f"{name}.npy"
    if path.exists():
        return np.load(path)
    vectors = OnnxMiniLMEmbedder(PACKAGED_MODEL).embed_array(document_texts(corpus))
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def top(scores: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")[:depth]
    return order[scores[order] > 0]


def fused(bm25: np.ndarray, full_match: float, cosine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One query's convex scores (the service's default) and RRF scores; -1 / 0 off the lists."""
    keyword_top, semantic_top = top(bm25), np.argsort(-cosine, kind="stable")[:DEPTH]
    candidates = np.union1d(keyword_top, semantic_top)
    convex = np.full(len(cosine), -1.0)
    keyword_part = np.minimum(1.0, bm25[candidates] / full_match) if full_match else 0.0
    convex[candidates] = WEIGHT * np.clip(cosine[candidates], 0, 1) + (1 - WEIGHT) * keyword_part
    rrf = np.zeros(len(cosine))
    for ranked in (keyword_top, semantic_top):
        rrf[ranked] += 1 / (RRF_K + np.arange(1, len(ranked) + 1))
    return convex, rrf


def mean_ndcg(rankings: list[np.ndarray], ids: list[str], queries: list[dict], qrels: dict) -> float:
    return float(
        np.mean([ndcg_at([ids[i] for i in r[:10]], qrels[q["_id"]]) for q, r in zip(queries, rankings, strict=True)])
    )


def ranked(scores: list[np.ndarray]) -> list[np.ndarray]:
    return [np.argsort(-s, kind="stable")[:10] for s in scores]


def stress(name: str, sigmas: list[float]) -> None:
    from kb.embedding_providers import PACKAGED_MODEL, OnnxMiniLMEmbedder

    corpus, queries, qrels = load_beir(name)
    ids = [row["_id"] for row in corpus]
    bm25, full_match = keyword_half(corpus, queries)
    documents = document_vectors(name, corpus)
    vectors = OnnxMiniLMEmbedder(PACKAGED_MODEL).embed_array([query["text"] for query in queries])
    noise = np.random.default_rng(0).standard_normal(vectors.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    keyword = mean_ndcg([top(s) for s in bm25], ids, queries, qrels)  # matching documents only
    print(f"\n{name} ({len(queries)} queries): keyword {keyword:.3f}")
    print("sigma | semantic | hybrid (default) | RRF | hybrid - better half | hybrid - RRF")
    for sigma in sigmas:
        moved = vectors + sigma * noise
        cosine = (moved / np.linalg.norm(moved, axis=1, keepdims=True)) @ documents.T
        pairs = [fused(bm25[i], full_match[i], cosine[i]) for i in range(len(queries))]
        semantic = mean_ndcg(ranked(list(cosine)), ids, queries, qrels)
        hybrid = mean_ndcg(ranked([convex for convex, _ in pairs]), ids, queries, qrels)
        rrf = mean_ndcg(ranked([rrf for _, rrf in pairs]), ids, queries, qrels)
        print(
            f"{sigma:5.1f} | {semantic:.3f} | {hybrid:.3f} | {rrf:.3f} | "
            f"{hybrid - max(keyword, semantic):+.3f} | {hybrid - rrf:+.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["cranfield", "cisi", "dbpedia"])
    parser.add_argument("--sigmas", nargs="+", type=float, default=[0.0, 1.0, 2.0, 3.0, 4.0])
    args = parser.parse_args()
    setup_django(migrate=False)
    for name in args.sets:
        stress(name, args.sigmas)


if __name__ == "__main__":
    main()
