"""Cosine similarity with the HNSW index of each collection's embedding model: iterative index
scans so that filtered queries still fill the list, an exact scan when a filter leaves few chunks.
One query vector per model, cached per collections searched (``query_embeddings``).
"""

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.conf import settings
from pgvector import Vector

from kb.embedding_providers import EmbeddingError, embed_query
from kb.models import Collection, EmbeddingModel
from kb.replicas import read_connection
from kb.search.filters import Filters
from kb.vector_index import ef_search, vector_expression

if TYPE_CHECKING:
    import numpy as np

# Below this many chunks left by a filter, an exact vector scan beats walking the HNSW graph.
EXACT_SCAN_LIMIT = 5000


class QueryEmbeddingCache:
    """LRU of query vectors per (provider, model, collections searched, query): repeated queries
    are not re-embedded. The collections are part of the key because a hit answers faster: shared
    across collections, a token limited to one could tell by the time which texts others had
    searched for anywhere (15 of 15 probes, 143 against 494 ms).

    A vector is kept in pgvector's text form, as the statements take it: a search sends it twice
    (its nearest chunks, then the similarity of chunks found by keyword), and writing a vector's
    floats as text cost about 0.1 ms each time (384 of them). Its floats are kept beside it for
    evidence fusion, as parsing the text back cost 0.13 ms a search."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str, tuple[int, ...], str], tuple[str, array]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def vector(self, model: EmbeddingModel, query: str, collection_ids: Sequence[int]) -> str:
        """The query's vector as pgvector text (``[0.1,-0.2,...]``), for a search of these collections."""
        return self._kept(model, query, collection_ids)[0]

    def array(self, model: EmbeddingModel, query: str, collection_ids: Sequence[int]) -> "np.ndarray":
        """The query's vector as floats."""
        import numpy as np  # here, not at import: kb.search loads with every task and command

        floats = np.frombuffer(self._kept(model, query, collection_ids)[1], dtype=np.float64)
        floats.flags.writeable = False  # the cache's own floats, shared by every search of the query
        return floats

    def remember(
        self, model: EmbeddingModel, query: str, collection_ids: Sequence[int], vector: Sequence[float]
    ) -> tuple[str, array]:
        """Keep ``query``'s vector of ``model`` (bench/search.py gives vectors it computed itself)."""
        key, kept = self._key(model, query, collection_ids), (Vector(vector).to_text(), array("d", vector))
        with self._lock:
            self._items[key] = kept
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return kept

    def _kept(self, model: EmbeddingModel, query: str, collection_ids: Sequence[int]) -> tuple[str, array]:
        key = self._key(model, query, collection_ids)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
            self.misses += 1
        return self.remember(model, query, collection_ids, embed_query(model.provider, model.name, query))

    @staticmethod
    def _key(model: EmbeddingModel, query: str, collection_ids: Sequence[int]) -> tuple[str, str, tuple[int, ...], str]:
        return model.provider, model.name, tuple(sorted(collection_ids)), query


query_embeddings = QueryEmbeddingCache(settings.KB_QUERY_CACHE_SIZE)


def by_model(targets: list[Collection]) -> dict[int, tuple[EmbeddingModel, list[int]]]:
    groups: dict[int, tuple[EmbeddingModel, list[int]]] = {}
    for collection in targets:
        model = collection.embedding_model
        groups.setdefault(model.pk, (model, []))[1].append(collection.pk)
    return groups


def vector_search(
    query: str, targets: list[Collection], filters: Filters, depth: int, *, ranked: bool
) -> dict[int, tuple[int, float]]:
    """chunk id -> (rank within its model's list, cosine similarity). One query vector per model.
    ``ranked``: the list is the answer (semantic search), not candidates to re-score (hybrid)."""
    hits: dict[int, tuple[int, float]] = {}
    for model, collection_ids in by_model(targets).values():
        if not model.dimensions:
            continue  # nothing embedded with this model yet
        vector = query_embeddings.vector(model, query, collection_ids)
        scoped = filters.within(collection_ids)
        for rank, (chunk_id, similarity) in enumerate(_nearest(model, vector, scoped, depth, ranked), start=1):
            hits[chunk_id] = (rank, similarity)
    return hits


def _nearest(
    model: EmbeddingModel, query_vector: str, filters: Filters, depth: int, ranked: bool
) -> list[tuple[int, float]]:
    expression = vector_expression(model, alias="e")
    with read_connection().cursor() as cursor:
        if filters.narrows_documents:
            where, params = filters.sql("d")
            cursor.execute(
                f"SELECT count(*) FROM (SELECT 1 FROM kb_chunk c JOIN kb_document d ON d.id = c.document_id "
                f"WHERE c.collection_id = ANY(%s) AND {where} LIMIT {EXACT_SCAN_LIMIT + 1}) AS allowed",
                [list(filters.collection_ids), *params],
            )
            if cursor.fetchone()[0] <= EXACT_SCAN_LIMIT:
                return _exact_nearest(cursor, model, expression, query_vector, filters, depth)
        document_join, document_params = "", []
        if filters.narrows_documents:
            where, document_params = filters.sql("d")
            document_join = (
                f"JOIN kb_chunk c ON c.id = e.chunk_id JOIN kb_document d ON d.id = c.document_id AND {where}"
            )
        # Both settings in one round trip, for this transaction only (SET LOCAL).
        cursor.execute(
            "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true)",
            [str(ef_search(model, depth, cursor, ranked=ranked))],
        )
        # relaxed_order may return neighbours slightly out of order: sort again outside (equal
        # distances, copies of one text, by chunk id, as keyword and hybrid lists order their ties).
        cursor.execute(
            f"""
            WITH nearest AS MATERIALIZED (
                SELECT e.chunk_id, {expression} <=> %s::vector({model.dimensions}) AS distance
                FROM kb_embedding e {document_join}
                WHERE e.model_id = %s AND e.collection_id = ANY(%s)
                ORDER BY distance LIMIT %s
            )
            SELECT chunk_id, 1 - distance FROM nearest ORDER BY distance, chunk_id
            """,
            [query_vector, *document_params, model.pk, list(filters.collection_ids), depth],
        )
        return cursor.fetchall()


def _exact_nearest(cursor, model, expression, query_vector, filters, depth) -> list[tuple[int, float]]:  # noqa: ANN001
    where, params = filters.sql("d")
    cursor.execute(
        f"""
        SELECT e.chunk_id, 1 - ({expression} <=> %s::vector({model.dimensions})) AS similarity
        FROM kb_embedding e JOIN kb_chunk c ON c.id = e.chunk_id JOIN kb_document d ON d.id = c.document_id
        WHERE e.model_id = %s AND e.collection_id = ANY(%s) AND {where}
        ORDER BY similarity DESC, e.chunk_id LIMIT %s
        """,
        [query_vector, model.pk, list(filters.collection_ids), *params, depth],
    )
    return cursor.fetchall()


def similarities_of(query: str, targets: list[Collection], chunk_ids: list[int]) -> dict[int, float]:
    """Cosine similarity of given chunks (found by keyword) to the query, where they have vectors."""
    if not chunk_ids:
        return {}
    found: dict[int, float] = {}
    for model, collection_ids in by_model(targets).values():
        if not model.dimensions:
            continue
        try:
            vector = query_embeddings.vector(model, query, collection_ids)
        except EmbeddingError:
            continue
        expression = vector_expression(model, alias="e")
        with read_connection().cursor() as cursor:
            cursor.execute(
                f"SELECT e.chunk_id, 1 - ({expression} <=> %s::vector({model.dimensions})) FROM kb_embedding e "
                "WHERE e.model_id = %s AND e.collection_id = ANY(%s) AND e.chunk_id = ANY(%s)",
                [vector, model.pk, collection_ids, chunk_ids],
            )
            found.update(cursor.fetchall())
    return found
