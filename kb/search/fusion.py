"""Ranking the union of both lists: by the evidence of both halves (``fusion="evidence"``, the
default), by a convex combination of the normalised scores (``score``, ``fusion="convex"``), or by
weighted Reciprocal Rank Fusion (``fusion="rrf"``, seed 002's contract), and the bounds that say
which half-found candidates are worth looking up.
"""

import heapq
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from django.conf import settings

if TYPE_CHECKING:
    import numpy as np


def fuse(
    keyword_hits: list[tuple[int, float]], vector_hits: dict[int, tuple[int, float]], weight: float, mode: str
) -> list[tuple[int, float]]:
    k = settings.KB_RRF_K
    scores: dict[int, float] = defaultdict(float)
    if mode == "keyword":
        return list(keyword_hits)
    if mode == "semantic":
        return sorted(
            ((chunk_id, sim) for chunk_id, (_, sim) in vector_hits.items()), key=lambda item: (-item[1], item[0])
        )
    for rank, (chunk_id, _) in enumerate(keyword_hits, start=1):
        scores[chunk_id] += 2 * (1 - weight) / (k + rank)
    for chunk_id, (rank, _) in vector_hits.items():
        scores[chunk_id] += 2 * weight / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


class _OfBothHalves(ABC):
    """A value of each chunk from its cosine and its BM25 (``combine``), computed for many at once."""

    # A chunk without a cosine (no vector, or not looked up yet) counts with the lowest one that
    # matters, so that a value from the halves found so far is a lower bound (see contenders).
    missing_cosine: ClassVar[float] = 0.0

    def of_each(
        self,
        chunk_ids: Iterable[int],
        similarities: Mapping[int, float | None],
        bm25: Mapping[int, float],
        *,
        similarity_cap: float | None = None,
        bm25_cap: float = 0.0,
    ) -> dict[int, float]:
        """The value of each chunk; one missing from ``similarities`` or ``bm25`` counts with the
        cap given (an upper bound), by default with nothing. In NumPy, because every hybrid search
        values a few hundred candidates this way (README, Many clients at once)."""
        import numpy as np  # here, not at import: kb.search loads with every task and command

        chunk_ids = list(chunk_ids)
        found = (similarities.get(c, similarity_cap) for c in chunk_ids)
        cosine = np.array([self.missing_cosine if v is None else v for v in found], dtype=np.float64)
        cosine = np.nan_to_num(cosine, nan=self.missing_cosine)  # a zero vector's cosine is NaN
        keyword = np.array([bm25.get(c, bm25_cap) for c in chunk_ids], dtype=np.float64)
        return dict(zip(chunk_ids, self.combine(cosine, keyword).tolist(), strict=True))

    @abstractmethod
    def combine(self, cosine: "np.ndarray", bm25: "np.ndarray") -> "np.ndarray":
        """The values of chunks with these cosines (NaN as 0) and BM25 values."""


@dataclass(frozen=True)
class Relevance(_OfBothHalves):
    """The [0, 1] score: ``w * clip(cosine, 0, 1) + (1 - w) * min(1, bm25 / full_match)``."""

    full_match: float
    weight: float

    def combine(self, cosine: "np.ndarray", bm25: "np.ndarray") -> "np.ndarray":
        import numpy as np

        keyword = np.minimum(1.0, bm25 / self.full_match) if self.full_match else np.zeros_like(bm25)
        # Rounded as results show it, so a score read from a result is a threshold that keeps it.
        return np.round(self.weight * np.clip(cosine, 0.0, 1.0) + (1 - self.weight) * keyword, 6)


@dataclass(frozen=True)
class Evidence(_OfBothHalves):
    """The order of ``fusion="evidence"``, in nats: ``w * S + (1 - w) * K``. S is the semantic
    evidence, -log P(Z >= (cosine - mean) / deviation), how unlikely the cosine is among the chunks
    of the collections searched (kb.search.background); K is BM25 on its log-odds scale, times 1 + k1, so that one
    occurrence in a chunk of average length counts its idf. Neither needs normalising, and a weak
    model's high cosines, common among the chunks, count for little (README, Search)."""

    weight: float
    mean: float
    deviation: float
    missing_cosine: ClassVar[float] = -1.0  # S is near 0 there; at cosine 0 it is not

    def combine(self, cosine: "np.ndarray", bm25: "np.ndarray") -> "np.ndarray":
        import numpy as np

        semantic = np.array([_surprise(z) for z in ((cosine - self.mean) / self.deviation).tolist()])
        return self.weight * semantic + (1 - self.weight) * bm25 * (1 + settings.KB_BM25_K1)


def _surprise(z: float) -> float:
    """-log P(Z >= z) for a standard normal Z; from z 37 on, where erfc is about to underflow, its
    asymptotic series (to 1e-10 there, so the value still rises with z)."""
    if z < 37.0:
        return -math.log(0.5 * math.erfc(z / math.sqrt(2.0)))
    return z * z / 2.0 + math.log(z * math.sqrt(2.0 * math.pi)) - math.log1p(-1 / z**2 + 3 / z**4 - 15 / z**6)


def contenders(
    chunk_ids: list[int],
    known: dict[int, float],
    bm25: Mapping[int, float],
    cosine: Mapping[int, float],
    relevance: Relevance | Evidence,
    top_k: int,
    depth: int,
    one_model: bool,
) -> list[int]:
    """The candidates found by one half only whose other half could still lift them into the top k:
    only these are looked up. ``known`` is every candidate's value (``relevance``, what ranks)
    from the halves found so far,
    ``bm25`` and ``cosine`` the two lists as they came back. A chunk missing from a full keyword
    list has at most that list's last BM25 (the keyword top is exact), from a shorter one none. A
    chunk missing from one model's full vector list is at most as similar as its last chunk (as far
    as the index's recall goes); otherwise nothing is assumed."""
    half_found = [c for c in chunk_ids if c not in bm25 or c not in cosine]
    if len(chunk_ids) <= top_k:
        return half_found
    bm25_cap = min(bm25.values()) if len(bm25) >= depth else 0.0
    cosine_cap = min(cosine.values()) if one_model and len(cosine) >= depth else 1.0
    threshold = heapq.nlargest(top_k, (known[c] for c in chunk_ids))[-1]
    bounds = relevance.of_each(half_found, cosine, bm25, similarity_cap=cosine_cap, bm25_cap=bm25_cap)
    return [c for c in half_found if bounds[c] >= threshold]


def monotone(ranked: list[int], scores: dict[int, float]) -> list[tuple[int, float]]:
    """(chunk id, score) in rank order, each score capped by the one above it: under evidence or RRF
    order a score could otherwise rise down the list (under convex fusion the cap changes nothing)."""
    capped, ceiling = [], 1.0
    for chunk_id in ranked:
        ceiling = min(ceiling, scores[chunk_id])
        capped.append((chunk_id, ceiling))
    return capped
