"""Per-model HNSW indexes over the one embeddings table.

pgvector indexes need a fixed dimension, while the table holds vectors of every model. Each
model gets a partial expression index, ``(vector::vector(D)) WHERE model_id = M``, and
searches use the same expression and predicate so the planner picks it.
"""

import math
import time

from django.conf import settings
from django.db import connection

from kb.models import EmbeddingModel

HNSW_M = 16
# A better-connected graph finds more true neighbours at the same search breadth: at 100,000
# MiniLM vectors, recall@10 at ef_search 200 is 0.96 built with pgvector's default 64 and 0.98
# with 200, for 2.2x the build time and 1.6-1.9 ms instead of 0.5 per vector inserted (README).
HNSW_EF_CONSTRUCTION = 200
MAX_EF_SEARCH = 1000  # pgvector's limit
# Up to this many vectors in a model's index, KB_HNSW_EF_SEARCH as it is (see ef_search).
EF_SEARCH_BASE_SIZE = 10_000
INDEX_SIZE_SECONDS = 60  # how long a process trusts the size it last read

_index_sizes: dict[int, tuple[float, float]] = {}  # model id -> (vectors, monotonic time read)


def hnsw_index_name(model: EmbeddingModel) -> str:
    return f"kb_embedding_hnsw_model_{model.pk}"


def vector_expression(model: EmbeddingModel, alias: str = "") -> str:
    """The SQL expression the model's index is built on; queries must use the same one."""
    column = f"{alias}.vector" if alias else "vector"
    return f"({column}::vector({int(model.dimensions or 0)}))"


def ensure_hnsw_index(model: EmbeddingModel) -> None:
    if not model.dimensions:
        raise ValueError(f"{model} has no known dimensions yet")
    with connection.cursor() as cursor:
        # CREATE INDEX refuses to run while the transaction has deferred foreign-key checks
        # pending on the table: run them now, then defer again (every deferrable constraint
        # of ours is initially deferred, so this restores the default).
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {hnsw_index_name(model)} ON kb_embedding "
            f"USING hnsw ({vector_expression(model)} vector_cosine_ops) "
            f"WITH (m = {HNSW_M}, ef_construction = {HNSW_EF_CONSTRUCTION}) "
            f"WHERE model_id = {int(model.pk)}"
        )
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")


def drop_hnsw_index(model: EmbeddingModel) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {hnsw_index_name(model)}")


def ef_search(model: EmbeddingModel, depth: int, cursor, *, ranked: bool) -> int:  # noqa: ANN001 - a DB cursor
    """hnsw.ef_search for the ``depth`` nearest vectors of ``model``.

    A graph search of fixed breadth finds fewer of the true nearest as the graph grows, so a
    list that is the answer (``ranked``: semantic search) searches KB_HNSW_EF_SEARCH wide up to
    EF_SEARCH_BASE_SIZE vectors and wider with the square root of the index's size beyond.
    A candidate list (hybrid) keeps KB_HNSW_EF_SEARCH: its chunks and the keyword list's are
    all re-scored exactly, so a near neighbour it misses seldom matters (README, Search speed)."""
    breadth = settings.KB_HNSW_EF_SEARCH
    if ranked:
        breadth *= math.sqrt(max(1.0, indexed_vectors(model, cursor) / EF_SEARCH_BASE_SIZE))
    return min(MAX_EF_SEARCH, max(depth, round(breadth)))


def indexed_vectors(model: EmbeddingModel, cursor) -> float:  # noqa: ANN001 - a DB cursor
    """About how many vectors the model's HNSW index holds: the chunks of the collections that
    search with the model, which triggers keep counted (Postgres' own count of an index that grows
    by inserts lags until autovacuum). Read at most once a minute per process."""
    known = _index_sizes.get(model.pk)
    if known and time.monotonic() - known[1] < INDEX_SIZE_SECONDS:
        return known[0]
    cursor.execute(
        "SELECT coalesce(sum(s.chunk_count), 0)::float8 FROM kb_collection_stats s "
        "JOIN kb_collection c ON c.id = s.collection_id WHERE c.embedding_model_id = %s",
        [model.pk],
    )
    size = cursor.fetchone()[0]
    _index_sizes[model.pk] = (size, time.monotonic())
    return size
