"""How a query's cosines spread over the chunks searched, for evidence fusion (kb.search.fusion).

A chunk's cosine counts as evidence by how unlikely it is among the collection's chunks: a weak
model's, or a narrow collection's, high cosines are common there and count for little. The
spread of every chunk's cosine to a query q is known from the mean m and covariance S of the
chunks' unit vectors alone: mean q·m, variance qᵀSq. Both are estimated once from a sample of the
stored vectors, kept per process for each (model, collections searched), and sampled again when
the collections have grown or shrunk by a tenth (README, Search).
"""

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.models import EmbeddingModel
from kb.replicas import read_connection

if TYPE_CHECKING:  # NumPy loads with the first background, not with kb.search (every task and command)
    import numpy as np

SAMPLE_SIZE = 2000
# Below this many chunks a sample says too little about the spread: hybrid ranks by the convex score.
MIN_BACKGROUND_CHUNKS = 200
RESAMPLE_GROWTH = 0.1
# A sample too small to use (chunks not embedded yet) is taken again after this long, not at every search.
RETRY_SECONDS = 60.0
# Each entry holds a d x d matrix (0.6 MB at 384 dimensions, 9 MB at 1,536).
CACHE_SIZE = 8


@dataclass(frozen=True)
class Background:
    mean: "np.ndarray"
    covariance: "np.ndarray"

    @classmethod
    def of_sample(cls, vectors: "np.ndarray") -> "Background":
        import numpy as np

        units = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return cls(mean=units.mean(axis=0), covariance=np.cov(units.T, bias=True).astype(np.float32))

    def spread(self, query_vector: "np.ndarray") -> tuple[float, float]:
        """The mean and the standard deviation of the query's cosine over the chunks."""
        import numpy as np

        unit = query_vector / max(float(np.linalg.norm(query_vector)), 1e-12)
        narrow = unit.astype(np.float32)  # as the covariance is kept: half the memory, no copy per query
        variance = float(narrow @ self.covariance @ narrow)
        return float(unit @ self.mean), math.sqrt(max(variance, 1e-12))


class Backgrounds:
    """An LRU of backgrounds per (model, collections searched)."""

    def __init__(self, size: int) -> None:
        self.size = size
        # (model, collections) -> (the background or None, the chunk count and the time when sampled)
        self._items: OrderedDict[tuple[int, tuple[int, ...]], tuple[Background | None, float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, model: EmbeddingModel, collection_ids: Sequence[int], chunks: float) -> Background | None:
        """The background of these collections, which hold ``chunks`` chunks (kb_collection_stats);
        None below MIN_BACKGROUND_CHUNKS, without a statement."""
        if chunks < MIN_BACKGROUND_CHUNKS or not model.dimensions:
            return None
        key = (model.pk, tuple(sorted(collection_ids)))
        with self._lock:
            if key in self._items:
                background, sampled_chunks, sampled_at = self._items[key]
                grown = abs(chunks - sampled_chunks) > RESAMPLE_GROWTH * sampled_chunks
                if not grown and (background is not None or time.monotonic() - sampled_at < RETRY_SECONDS):
                    self._items.move_to_end(key)
                    return background
        vectors = sampled_vectors(model, key[1], chunks)
        background = None
        if len(vectors) >= MIN_BACKGROUND_CHUNKS:  # else most chunks have no vector yet
            background = Background.of_sample(vectors)
        with self._lock:
            self._items[key] = (background, chunks, time.monotonic())
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return background


def sampled_vectors(model: EmbeddingModel, collection_ids: Sequence[int], chunks: float) -> "np.ndarray":
    """Up to SAMPLE_SIZE of the collections' vectors of ``model``, at random, one per row. Reading
    the collections' rows costs ``chunks``; sampling the table's blocks costs about
    2 * SAMPLE_SIZE * rows / chunks (the whole table when the collections are a small part of it):
    the cheaper of the two. Vectors come in pgvector's binary form (vector_send: two 16-bit
    integers, then big-endian float4s): as text, parsing 2,000 of them took 170 ms of 260."""
    import numpy as np

    ids = list(collection_ids)
    chosen = "SELECT id FROM kb_embedding WHERE model_id = %s AND collection_id = ANY(%s) ORDER BY random() LIMIT %s"
    params: list = [model.pk, ids, SAMPLE_SIZE]
    with read_connection().cursor() as cursor:
        if chunks > SAMPLE_SIZE:
            cursor.execute("SELECT reltuples FROM pg_class WHERE oid = 'kb_embedding'::regclass")
            (table_rows,) = cursor.fetchone()
            if table_rows > 0 and chunks * chunks > 2 * SAMPLE_SIZE * table_rows:  # reltuples < 0: never analysed
                chosen = (
                    "SELECT id FROM kb_embedding TABLESAMPLE SYSTEM (%s) "
                    "WHERE model_id = %s AND collection_id = ANY(%s) LIMIT %s"
                )
                params = [min(100.0, 100.0 * 2 * SAMPLE_SIZE / chunks), *params]
        cursor.execute(f"SELECT vector_send(vector) FROM kb_embedding WHERE id IN ({chosen})", params)
        rows = cursor.fetchall()
    floats = np.frombuffer(b"".join(bytes(vector)[4:] for (vector,) in rows), dtype=">f4")
    return floats.astype(np.float64).reshape(len(rows), int(model.dimensions or 0))


backgrounds = Backgrounds(CACHE_SIZE)
