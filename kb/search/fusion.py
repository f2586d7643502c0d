"""Ranking the union of both lists: a convex combination of the normalised scores (``score``), or
weighted Reciprocal Rank Fusion (``fusion="rrf"``, seed 002's contract), and the bounds that say
which half-found candidates are worth looking up.
"""

from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings


def fuse(
    keyword_hits: list[tuple[int, float]], vector_hits: dict[int, tuple[int, float]], weight: float, mode: str
) -> list[tuple[int, float]]:
    k = settings.KB_RRF_K
    scores: dict[int, float] = defaultdict(float)
    if mode == "keyword":
        return list(keyword_hits)
    if mode == "semantic":
        return sorted(((chunk_id, sim) for chunk_id, (_, sim) in vector_hits.items()), key=lambda item: -item[1])
    for rank, (chunk_id, _) in enumerate(keyword_hits, start=1):
        scores[chunk_id] += 2 * (1 - weight) / (k + rank)
    for chunk_id, (rank, _) in vector_hits.items():
        scores[chunk_id] += 2 * weight / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class Relevance:
    """The [0, 1] score: ``w * clip(cosine, 0, 1) + (1 - w) * min(1, bm25 / full_match)``."""

    full_match: float
    weight: float

    def of(self, similarity: float | None, bm25: float) -> float:
        semantic = min(1.0, max(0.0, similarity or 0.0))
        keyword = min(1.0, bm25 / self.full_match) if self.full_match else 0.0
        # Rounded as results show it, so a score read from a result is a threshold that keeps it.
        return round(self.weight * semantic + (1 - self.weight) * keyword, 6)


def contenders(
    chunk_ids: list[int],
    keyword_hits: list[tuple[int, float]],
    vector_hits: dict[int, tuple[int, float]],
    relevance: Relevance,
    top_k: int,
    depth: int,
    one_model: bool,
) -> list[int]:
    """The candidates found by one half only whose other half could still lift them into the top k:
    only these are looked up. A chunk missing from a full keyword list has at most that list's
    last BM25 (the keyword top is exact), from a shorter one none. A chunk missing from one
    model's full vector list is at most as similar as its last chunk (as far as the index's recall
    goes); otherwise nothing is assumed."""
    bm25 = dict(keyword_hits)
    cosine = {chunk_id: sim for chunk_id, (_, sim) in vector_hits.items()}
    half_found = [c for c in chunk_ids if c not in bm25 or c not in cosine]
    if len(chunk_ids) <= top_k:
        return half_found
    bm25_cap = keyword_hits[-1][1] if len(keyword_hits) >= depth else 0.0
    cosine_cap = min(cosine.values()) if one_model and len(cosine) >= depth else 1.0
    threshold = sorted((relevance.of(cosine.get(c), bm25.get(c, 0.0)) for c in chunk_ids), reverse=True)[top_k - 1]
    return [c for c in half_found if relevance.of(cosine.get(c, cosine_cap), bm25.get(c, bm25_cap)) >= threshold]


def monotone(ranked: list[int], scores: dict[int, float]) -> list[tuple[int, float]]:
    """(chunk id, score) in rank order, each score capped by the one above it: under RRF order a
    score could otherwise rise down the list (under convex fusion the cap changes nothing)."""
    capped, ceiling = [], 1.0
    for chunk_id in ranked:
        ceiling = min(ceiling, scores[chunk_id])
        capped.append((chunk_id, ceiling))
    return capped
