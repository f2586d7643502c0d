"""How a query's cosines spread over the collections searched, for evidence fusion (kb.search.fusion).

A chunk's cosine counts as evidence by how unlikely it is among the collections' chunks: a weak
model's, or a narrow collection's, high cosines are common there and count for little. The
spread of every chunk's cosine to a query q follows from the first two moments of the chunks'
unit vectors alone: mean q·m, variance qᵀCq (C their covariance). They are estimated from a
sample of each collection's stored vectors, kept per process for each (model, collection), and
combined per search weighted by how many of each collection's chunks have a vector, so that a set
of collections is served by the entries of its members (README, Search). The whole collections count, whatever
filters narrow a search.
"""

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.replicas import read_connection

if TYPE_CHECKING:  # NumPy loads with the first background, not with kb.search (every task and command)
    import numpy as np

    from kb.models import EmbeddingModel

SAMPLE_SIZE = 2000
# The sample's order: ids scattered by a multiplicative hash, not random(), so that every process
# takes the same sample of the same rows and ranks a query the same way.
SCATTERED = "((id %% 2147483648) * 2654435761) %% 2147483648"
# Below this many chunks a sample says too little about the spread: hybrid ranks by the convex score.
MIN_BACKGROUND_CHUNKS = 200
# Sampled again when the collections' chunk count has moved by this share, or after this long
# (vectors arrive after the chunks are counted, and a sync can replace texts without changing it).
RESAMPLE_GROWTH = 0.1
MAX_AGE_SECONDS = 600.0
# A sample short of its chunks' vectors (not embedded yet) is taken again sooner.
RETRY_SECONDS = 60.0
# Cosines closer than this are not told apart: a collection of near copies would otherwise make
# tiny differences of cosine outweigh every keyword.
MIN_DEVIATION = 1e-3
# How long a search waits for another one's first sample of a collection before it ranks without.
SAMPLE_WAIT_SECONDS = 5.0
# The cache's bound: each entry holds a d x d float32 matrix (0.6 MB at 384 dimensions, 9 MB at 1,536).
CACHE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Moments:
    """Of one collection's unit vectors of one model, from a sample: their mean and covariance."""

    mean: "np.ndarray"
    covariance: "np.ndarray"
    vectors: int  # in the sample
    chunks: float  # the collection's chunk count when sampled
    sampled_at: float

    @property
    def weight(self) -> float:
        """How many of the collection's chunks have a vector: a sample short of SAMPLE_SIZE read
        every vector of the collection (chunks not embedded yet have none and are not ranked by
        meaning); a full one, of a collection at least that large, counts its chunks."""
        return float(self.vectors) if self.vectors < SAMPLE_SIZE else max(self.chunks, float(self.vectors))

    def lifetime(self) -> float:
        return RETRY_SECONDS if self.vectors < min(SAMPLE_SIZE, self.chunks) else MAX_AGE_SECONDS

    @classmethod
    def of_sample(cls, vectors: "np.ndarray", chunks: float) -> "Moments":
        import numpy as np

        units = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        mean = units.mean(axis=0) if len(units) else np.zeros(vectors.shape[1])
        # Centred before it is narrowed to float32: a raw second moment minus the squared mean
        # cancels to nothing for a tight collection.
        centred = units - mean
        covariance = (centred.T @ centred / max(len(units), 1)).astype(np.float32)
        return cls(mean=mean, covariance=covariance, vectors=len(units), chunks=chunks, sampled_at=time.monotonic())


@dataclass(frozen=True)
class Background:
    parts: tuple[Moments, ...]

    def spread(self, query_vector: "np.ndarray") -> tuple[float, float]:
        """The mean and the standard deviation of the query's cosine over the collections' chunks:
        of a mixture, each collection's variance plus how far its mean lies from the whole's."""
        import numpy as np

        unit = query_vector / max(float(np.linalg.norm(query_vector)), 1e-12)
        narrow = unit.astype(np.float32)  # as the covariances are kept: half the memory, no copy per query
        parts = [part for part in self.parts if part.vectors]
        total = sum(part.weight for part in parts)
        means = [float(unit @ part.mean) for part in parts]
        mean = sum(part.weight * m for part, m in zip(parts, means, strict=True)) / total
        variance = (
            sum(
                part.weight * (float(narrow @ part.covariance @ narrow) + (m - mean) ** 2)
                for part, m in zip(parts, means, strict=True)
            )
            / total
        )
        return mean, math.sqrt(max(variance, MIN_DEVIATION**2))


class Backgrounds:
    """An LRU of the moments of each (model, collection), bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[int, int], Moments] = OrderedDict()
        self._lock = threading.Lock()
        self._flights: dict[tuple[int, int], threading.Lock] = {}  # samples being taken

    def of(self, model: "EmbeddingModel", collection_ids: Sequence[int], chunks: float) -> Background | None:
        """The background of these collections, which hold ``chunks`` chunks (kb_collection_stats);
        None below MIN_BACKGROUND_CHUNKS or for more collections than the cache holds (without a
        statement), and while fewer of their chunks have a vector."""
        dimensions = int(model.dimensions or 0)
        ids = sorted(set(collection_ids))
        if chunks < MIN_BACKGROUND_CHUNKS or not dimensions or len(ids) * dimensions * dimensions * 4 > self.max_bytes:
            return None
        with self._lock:
            known = [self._items.get((model.pk, collection_id)) for collection_id in ids]
            for collection_id, part in zip(ids, known, strict=True):
                if part is not None:
                    self._items.move_to_end((model.pk, collection_id))
        # The whole's count is what a search knows; when it moved by a tenth, every member is read again.
        counted = sum(part.chunks for part in known if part is not None)
        moved = abs(chunks - counted) > RESAMPLE_GROWTH * max(counted, 1.0)
        now = time.monotonic()
        parts = []
        for collection_id, part in zip(ids, known, strict=True):
            if part is None or moved or now - part.sampled_at > part.lifetime():
                part = self._sample_once(model, collection_id, part)
                if part is None:
                    return None
            parts.append(part)
        if sum(part.vectors for part in parts) < MIN_BACKGROUND_CHUNKS:
            return None
        return Background(tuple(parts))

    def _sample_once(self, model: "EmbeddingModel", collection_id: int, stale: Moments | None) -> Moments | None:
        """One search samples a collection at a time (34-60 ms of a search's thread and Postgres):
        the others rank by the sample there is while it is taken again, or wait for the first one
        (at most SAMPLE_WAIT_SECONDS; None then: the convex order)."""
        key = (model.pk, collection_id)
        with self._lock:
            flight = self._flights.setdefault(key, threading.Lock())
        if stale is not None and not flight.acquire(blocking=False):
            return stale
        if stale is None and not flight.acquire(timeout=SAMPLE_WAIT_SECONDS):
            return None
        try:
            with self._lock:  # another search may have sampled it since this one looked
                taken = self._items.get(key)
            if taken is not None and taken is not stale and time.monotonic() - taken.sampled_at <= taken.lifetime():
                return taken
            return self._sample(model, collection_id)
        finally:
            with self._lock:
                if self._flights.get(key) is flight:
                    del self._flights[key]
            flight.release()

    def _sample(self, model: "EmbeddingModel", collection_id: int) -> Moments:
        chunks, vectors = sampled_vectors(model, collection_id)
        moments = Moments.of_sample(vectors, chunks)
        with self._lock:
            self._items[(model.pk, collection_id)] = moments
            self._items.move_to_end((model.pk, collection_id))
            while sum(item.covariance.nbytes for item in self._items.values()) > self.max_bytes:
                self._items.popitem(last=False)
        return moments


def sampled_vectors(model: "EmbeddingModel", collection_id: int) -> tuple[float, "np.ndarray"]:
    """The collection's chunk count and up to SAMPLE_SIZE of its vectors of ``model``, scattered.
    Reading the collection's rows costs its chunk count; sampling the table's blocks about
    2 * SAMPLE_SIZE * rows / chunks (the whole table when the collection is a small part of it):
    the cheaper of the two. Vectors come in pgvector's binary form (vector_send: the dimension and
    an unused 16-bit integer, then big-endian float4s): as text, parsing 2,000 of them took 170 ms
    of 260. Rows of another dimension are left out."""
    import numpy as np

    dimensions = int(model.dimensions or 0)
    where = f"model_id = %s AND collection_id = %s ORDER BY {SCATTERED} LIMIT %s"
    chosen, params = f"SELECT id FROM kb_embedding WHERE {where}", [model.pk, collection_id, SAMPLE_SIZE]
    with read_connection().cursor() as cursor:
        cursor.execute(
            "SELECT coalesce((SELECT chunk_count FROM kb_collection_stats WHERE collection_id = %s), 0)::float8, "
            "(SELECT reltuples FROM pg_class WHERE oid = 'kb_embedding'::regclass)::float8",
            [collection_id],
        )
        chunks, table_rows = cursor.fetchone()
        if chunks > SAMPLE_SIZE and 0 < table_rows < chunks * chunks / (2 * SAMPLE_SIZE):  # < 0: never analysed
            # Blocks come in table order: the order is taken among them, not their first rows.
            chosen = f"SELECT id FROM kb_embedding TABLESAMPLE SYSTEM (%s) REPEATABLE (0) WHERE {where}"
            params = [min(100.0, 100.0 * 2 * SAMPLE_SIZE / chunks), *params]
        cursor.execute(f"SELECT vector_send(vector) FROM kb_embedding WHERE id IN ({chosen})", params)
        rows = [bytes(vector) for (vector,) in cursor.fetchall()]
    rows = [row for row in rows if int.from_bytes(row[:2], "big") == dimensions]
    floats = np.frombuffer(b"".join(row[4:] for row in rows), dtype=">f4")
    return chunks, floats.astype(np.float64).reshape(len(rows), dimensions)


backgrounds = Backgrounds(CACHE_BYTES)
