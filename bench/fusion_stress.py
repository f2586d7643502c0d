"""How the default fusion holds when the semantic half is the weak one (issue 14, held-out sets).

The shared sets have no collection where BM25 is far ahead of dense search (BEIR's Touché-2020
and TREC-COVID are such). This makes one in two ways, each lowering semantic nDCG@10 step by step
while the keyword half stays as it is: ``--sigmas`` moves each query's vector by Gaussian noise of
growing size (fixed seed); ``--dims`` keeps only the first k of the model's 384 dimensions (queries
and documents, renormalised), a weaker model that, like a real one, still gives wrong documents
high cosines. For every step it prints nDCG@10 of keyword, semantic, hybrid as the search service
fuses by default (kb.search.fusion's convex ``Relevance`` at KB_SEMANTIC_WEIGHT, over each half's
top 100 with both scores known), bench/quality.py's RRF reference (k 60, equal weights) and the
evidence fusion README describes (``evidence``: the cosine's surprise against the collection's
background plus BM25 on its log-odds scale), then hybrid minus the better half and minus RRF:
issue 14's acceptance wants both >= -0.005.

In memory, to be quick: bm25s' tokens (English stemmer and stop words) with k1 1.5, b 0.75 and
Lucene's idf (the service's BM25 formula; ``full_match`` as kb.search.bm25 computes it), one
vector per document from the packaged all-MiniLM-L6-v2. Its sigma 0 row is close to, not equal
to, bench/quality.py's service figures. Document vectors are kept in var/bench-fusion.

    .venv/bin/python bench/fusion_stress.py [--sets cranfield cisi dbpedia] [--sigmas 0 1 2 3 4]
        [--dims 384 64 32 16]
"""

import argparse
import math
from collections import Counter

import numpy as np
from common import ROOT, load_beir, setup_django
from quality import DEPTH, measured, rrf_reference

CACHE = ROOT / "var" / "bench-fusion"


def document_texts(corpus: list[dict]) -> list[str]:
    return [f"{row.get('title', '')} {row['text']}" for row in corpus]


def keyword_half(corpus: list[dict], queries: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """bm25s' score of every document for every query, and each query's full-match scale on the
    same footing: bm25s multiplies by k1 + 1, which kb.search.bm25 leaves out of both, so the
    keyword part (score over full match) is the service's."""
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


def top(scores: np.ndarray, *, matching_only: bool) -> list[int]:
    order = np.argsort(-scores, kind="stable")[:DEPTH]
    return (order[scores[order] > 0] if matching_only else order).tolist()


def hybrid_ranking(
    keyword: list[int], semantic: list[int], bm25: np.ndarray, full_match: float, cosine: np.ndarray
) -> list[int]:
    """The service's default ranking of one query's candidates: the union of both top lists."""
    from django.conf import settings

    from kb.search.fusion import Relevance

    candidates = sorted(set(keyword) | set(semantic))
    scores = Relevance(full_match, settings.KB_SEMANTIC_WEIGHT).of_each(
        candidates, {c: float(cosine[c]) for c in candidates}, {c: float(bm25[c]) for c in candidates}
    )
    return sorted(candidates, key=lambda c: (-scores[c], c))


def evidence_ranking(
    keyword: list[int], semantic: list[int], bm25: np.ndarray, cosine: np.ndarray, background: tuple[float, float]
) -> list[int]:
    """The union of both top lists by evidence in nats: -log P(Z >= z) of the cosine's z against
    the query's background (mean, deviation) over the collection, plus BM25 on bm25s' scale
    (k1 + 1 included: one occurrence in a chunk of average length counts its idf, a log-odds)."""
    mean, deviation = background
    candidates = sorted(set(keyword) | set(semantic))
    z = (cosine[candidates] - mean) / deviation
    # -log of the normal tail; its asymptote z^2/2 + log(z sqrt(2 pi)) where erfc underflows
    surprise = np.array([
        -math.log(0.5 * math.erfc(v / math.sqrt(2))) if v < 25 else v * v / 2 + math.log(v * math.sqrt(2 * math.pi))
        for v in z
    ])  # fmt: skip
    scores = dict(zip(candidates, (surprise + bm25[candidates]).tolist(), strict=True))
    return sorted(candidates, key=lambda c: (-scores[c], c))


def stress(name: str, steps: list[tuple[str, float]]) -> None:
    """``steps``: ("sigma", noise) or ("dims", kept dimensions)."""
    from kb.embedding_providers import PACKAGED_MODEL, OnnxMiniLMEmbedder

    corpus, queries, qrels = load_beir(name)
    ids = [row["_id"] for row in corpus]
    query_ids = [query["_id"] for query in queries]
    bm25, full_match = keyword_half(corpus, queries)
    keyword_tops = [top(scores, matching_only=True) for scores in bm25]
    keyword = measured({q: [ids[i] for i in t] for q, t in zip(query_ids, keyword_tops, strict=True)}, qrels)[0]
    model_documents = document_vectors(name, corpus)
    vectors = OnnxMiniLMEmbedder(PACKAGED_MODEL).embed_array([query["text"] for query in queries])
    noise = np.random.default_rng(0).standard_normal(vectors.shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    print(f"\n{name} ({len(queries)} queries): keyword {keyword:.3f}")
    print(
        "step | semantic | hybrid (default) | RRF | evidence | hybrid - better half | hybrid - RRF | evidence - better half"
    )
    for kind, size in steps:
        kept = int(size) if kind == "dims" else vectors.shape[1]
        documents = unit(model_documents[:, :kept])
        moved = unit(vectors[:, :kept] + (size * noise if kind == "sigma" else 0))
        cosine = moved @ documents.T
        means, deviations = (
            moved @ documents.mean(axis=0),
            np.sqrt(np.einsum("qi,ij,qj->q", moved, covariance(documents), moved)),
        )
        semantic_tops = [top(row, matching_only=False) for row in cosine]
        keyword_runs, semantic_runs, hybrid_runs, evidence_runs = {}, {}, {}, {}
        for i, query_id in enumerate(query_ids):
            keyword_runs[query_id] = [ids[d] for d in keyword_tops[i]]
            semantic_runs[query_id] = [ids[d] for d in semantic_tops[i]]
            ranking = hybrid_ranking(keyword_tops[i], semantic_tops[i], bm25[i], full_match[i], cosine[i])
            hybrid_runs[query_id] = [ids[d] for d in ranking]
            ranking = evidence_ranking(keyword_tops[i], semantic_tops[i], bm25[i], cosine[i], (means[i], deviations[i]))
            evidence_runs[query_id] = [ids[d] for d in ranking]
        semantic = measured(semantic_runs, qrels)[0]
        hybrid, evidence = measured(hybrid_runs, qrels)[0], measured(evidence_runs, qrels)[0]
        rrf = measured(rrf_reference(keyword_runs, semantic_runs), qrels)[0]
        better = max(keyword, semantic)
        print(
            f"{kind} {size:g} | {semantic:.3f} | {hybrid:.3f} | {rrf:.3f} | {evidence:.3f} | "
            f"{hybrid - better:+.3f} | {hybrid - rrf:+.3f} | {evidence - better:+.3f}"
        )


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def covariance(vectors: np.ndarray) -> np.ndarray:
    return np.cov(vectors.T.astype(np.float64), bias=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["cranfield", "cisi", "dbpedia"])
    parser.add_argument("--sigmas", nargs="*", type=float, default=[0.0, 1.0, 2.0, 3.0, 4.0])
    parser.add_argument("--dims", nargs="*", type=int, default=[64, 32, 16], help="of the model's 384")
    args = parser.parse_args()
    setup_django(migrate=False)
    steps = [("sigma", sigma) for sigma in args.sigmas] + [("dims", dims) for dims in args.dims]
    for name in args.sets:
        stress(name, steps)


if __name__ == "__main__":
    main()
