"""Search: BM25 keyword ranking and pgvector similarity, fused by a convex combination of their scores.

One service for every front door (admin playground, API, MCP, ``kb_search``):

- ``keyword``: Okapi BM25 over the postings the database maintains (kb/migrations/0002), with
  the collection statistics of exactly the collections searched. Exact, with MaxScore-style
  pruning: the rare terms are scored over their whole posting lists, the common ones only for
  the candidates, and the pruning is undone whenever it could change the top results.
- ``semantic``: cosine similarity with the HNSW index of each collection's embedding model,
  iterative index scans so that filtered queries still fill ``top_k``; an exact scan when a
  filter leaves few chunks.
- ``hybrid`` (default): both lists, each ``candidate_depth`` deep; every chunk of either list
  gets both its cosine and its BM25 and the union is ranked by ``score`` (below), a convex
  combination of the two normalised by their theoretical ranges rather than by each query's
  observed minimum and maximum (``fusion="convex"``). ``fusion="rrf"`` ranks by weighted
  Reciprocal Rank Fusion instead (seed 002's contract).

Every result's ``score`` is one relevance scale in [0, 1] whatever the mode, so that one threshold
(``min_score``, or a client keeping ``score > 0.5``) means the same in each:
``score = w * clip(cosine, 0, 1) + (1 - w) * min(1, bm25 / full_match)``, where ``full_match`` is
the BM25 value of a chunk of average length that holds every query term once (so 1.0 = all the
query's words are there; terms found nowhere count against it too) and ``w`` is 1 for semantic, 0
for keyword, the semantic weight for hybrid. Under RRF order a result's score is capped by the one
above it, so scores never rise with the rank and a threshold cuts the list at one place. The raw
values stay: ``similarity`` (cosine), ``keyword_score`` (BM25), and in hybrid mode
``fused_score``, the weighted RRF value ``2w/(k + vector_rank) + 2(1-w)/(k + keyword_rank)``.

Filters fail closed: an unknown collection is an error, an empty list of documents matches
nothing, an unknown operator is INVALID_ARGUMENT.

``top_k``, ``mode`` and ``semantic_weight`` left out take the searched collection's own search
settings (search_top_k; search_hybrid false means keyword; semantic_weight) when one collection is
searched, and the server's defaults (10, hybrid, KB_SEMANTIC_WEIGHT) across several.
"""

import math
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from django.conf import settings
from django.db import connection, transaction
from pgvector import Vector
from pydantic import BaseModel, ConfigDict, Field, computed_field

from kb.embedding_providers import EmbeddingError, embed_texts
from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import CONTENT_TYPES
from kb.models import DEFAULT_TOP_K, MAX_TOP_K, Collection, EmbeddingModel
from kb.storable import check_storable
from kb.vector_index import vector_expression

Mode = Literal["hybrid", "semantic", "keyword"]
MODES: tuple[str, ...] = get_args(Mode)
Fusion = Literal["convex", "rrf"]
FUSIONS: tuple[str, ...] = get_args(Fusion)
METADATA_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in")
# Below this many chunks left by a filter, an exact vector scan beats walking the HNSW graph.
EXACT_SCAN_LIMIT = 5000
MIN_CANDIDATE_DEPTH = 100
MAX_CANDIDATE_DEPTH = 10_000
# Postings read in full before the remaining (common) query terms are only looked up.
POSTINGS_BUDGET = 20000


class SearchResult(BaseModel):
    """One hit: the shape every door shows (REST and ``kb_search --json`` as is; the MCP profiles
    map it to their seeds' shapes)."""

    model_config = ConfigDict(frozen=True)

    rank: int
    score: float = Field(description="Relevance from 0 to 1, on one scale in every mode (README, Search)")
    fused_score: float | None = Field(
        description="The weighted Reciprocal Rank Fusion value (hybrid only); hybrid results are ranked by score"
    )
    similarity: float | None
    vector_rank: int | None
    keyword_rank: int | None
    keyword_score: float | None
    chunk_id: int
    content: str
    document_id: str
    source_uri: str
    title: str
    content_type: str
    collection: str
    chunk_index: int
    line_start: int
    line_end: int
    page: int | None
    heading_path: list[str] = Field(description="Titles of the sections the chunk starts in, outermost first")
    token_count: int
    metadata: dict[str, Any]
    chunk_metadata: dict[str, Any]
    document_hits: int | None = Field(
        None, description="With group_by_document: how many candidate chunks of both lists come from this document"
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def lines(self) -> str:
        return f"{self.line_start}-{self.line_end}"


class SearchResponse(BaseModel):
    model_config = ConfigDict(frozen=True)

    query: str
    mode: Mode
    semantic_weight: float
    results: list[SearchResult]
    warnings: list[str] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_results(self) -> int:
        return len(self.results)


@dataclass(frozen=True)
class Filters:
    """Restrictions on the chunks searched; every one narrows, none widens."""

    collection_ids: tuple[int, ...]
    document_ids: tuple[str, ...] | None = None
    content_types: tuple[str, ...] | None = None
    metadata: tuple[tuple[str, str, Any], ...] = ()

    @property
    def narrows_documents(self) -> bool:
        return self.document_ids is not None or self.content_types is not None or bool(self.metadata)

    def sql(self, document_alias: str) -> tuple[str, list[Any]]:
        """A WHERE fragment over kb_document (aliased) for the document-level filters."""
        clauses, params = ["TRUE"], []
        if self.document_ids is not None:
            clauses.append(f"{document_alias}.id = ANY(%s)")
            params.append(list(self.document_ids))
        if self.content_types is not None:
            clauses.append(f"{document_alias}.content_type = ANY(%s)")
            params.append(list(self.content_types))
        for key, operator, value in self.metadata:
            clause, clause_params = _metadata_clause(f"{document_alias}.metadata", key, operator, value)
            clauses.append(clause)
            params.extend(clause_params)
        return " AND ".join(clauses), params


def search(
    *,
    query: str,
    collections: Sequence[str] | None = None,
    top_k: int | None = None,
    mode: str | None = None,
    semantic_weight: float | None = None,
    min_score: float | None = None,
    min_similarity: float | None = None,
    document_ids: Sequence[str] | None = None,
    content_types: Sequence[str] | None = None,
    metadata: dict[str, Any] | None = None,
    candidate_depth: int | None = None,
    fusion: str = "convex",
    group_by_document: bool = False,
) -> SearchResponse:
    """Rank chunks for ``query`` (README, Search). With ``group_by_document``, each document's best
    chunk stands for it and counts the document's other candidates."""
    query = (query or "").strip()
    if not query:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "The query is empty")
    if len(query) > settings.KB_MAX_QUERY_CHARS:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"The query has {len(query)} characters; the limit is {settings.KB_MAX_QUERY_CHARS} (KB_MAX_QUERY_CHARS)",
        )
    check_storable([query, metadata, document_ids, content_types, collections], what="search")
    validate_top_k(top_k)
    if candidate_depth is not None and not 1 <= candidate_depth <= MAX_CANDIDATE_DEPTH:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"candidate_depth must be between 1 and {MAX_CANDIDATE_DEPTH}")
    if fusion not in FUSIONS:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"fusion must be one of {', '.join(FUSIONS)}")
    if mode is not None and mode not in MODES:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"mode must be one of {', '.join(MODES)}")
    if semantic_weight is not None and not 0.0 <= semantic_weight <= 1.0:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "semantic_weight must be between 0.0 and 1.0")
    if min_score is not None and not 0.0 <= min_score <= 1.0:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "min_score must be between 0.0 and 1.0")
    if min_similarity is not None and not -1.0 <= min_similarity <= 1.0:
        raise KBError(ErrorCode.INVALID_ARGUMENT, "min_similarity must be between -1.0 and 1.0")
    if document_ids is not None and len(document_ids) > MAX_FILTER_DOCUMENTS:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"At most {MAX_FILTER_DOCUMENTS} document ids per search")
    targets = _collections(collections)
    top_k, mode, weight = _settings(top_k, mode, semantic_weight, targets)
    filters = Filters(
        collection_ids=tuple(collection.pk for collection in targets),
        document_ids=None if document_ids is None else tuple(str(doc) for doc in document_ids),
        content_types=None if content_types is None else tuple(_content_types(content_types)),
        metadata=tuple(_parse_metadata_filter(metadata or {})),
    )
    deep = mode == "hybrid" or group_by_document  # fusion and grouping look past the top k
    depth = max(candidate_depth or 0, max(MIN_CANDIDATE_DEPTH, 3 * top_k) if deep else top_k)
    warnings: list[str] = []
    if not targets:
        return SearchResponse(query=query, mode=mode, semantic_weight=weight, results=[])

    with transaction.atomic():  # SET LOCAL needs a transaction; one snapshot for both halves
        keyword = _KeywordQuery.of(query, filters) if mode in ("keyword", "hybrid") and weight < 1.0 else None
        keyword_hits = keyword.top(depth) if keyword else []
        vector_hits: dict[int, tuple[int, float]] = {}
        if mode in ("semantic", "hybrid") and weight > 0.0:
            try:
                vector_hits = _vector_search(query, targets, filters, depth)
            except EmbeddingError as error:
                if mode == "semantic":
                    raise
                warnings.append(f"Semantic search unavailable, keyword results only: {error.message}")
        fused = _fuse(keyword_hits, vector_hits, weight, mode)
        chunk_ids = [chunk_id for chunk_id, _ in fused]
        # No vector list at all (provider down, nothing embedded yet): the score is keyword relevance.
        relevance = _Relevance(keyword.full_match if keyword else 0.0, weight if vector_hits else 0.0)
        if min_similarity is not None or group_by_document:
            completed = chunk_ids
        elif mode == "hybrid" and fusion == "convex":
            one_model = len(_by_model(targets)) == 1
            completed = _contenders(chunk_ids, keyword_hits, vector_hits, relevance, top_k, depth, one_model)
        else:  # RRF needs both scores only for what it shows
            completed = chunk_ids[:top_k]
        similarities = {chunk_id: sim for chunk_id, (_, sim) in vector_hits.items()}
        if min_similarity is not None or (mode == "hybrid" and vector_hits):
            # Chunks found only by keyword get their similarity too (the query is embedded already).
            similarities.update(_similarities(query, targets, [c for c in completed if c not in similarities]))
        keyword_scores = dict(keyword_hits)
        if keyword and mode == "hybrid":  # found by meaning only: their BM25 counts towards the score
            keyword_scores.update(keyword.scores([c for c in completed if c not in keyword_scores]))
        scores = {c: relevance.of(similarities.get(c), keyword_scores.get(c, 0.0)) for c in chunk_ids}
        if mode == "hybrid" and fusion == "convex":
            # Ties (full keyword matches, where the keyword part is capped at 1) keep their RRF order.
            rrf = dict(fused)
            chunk_ids.sort(key=lambda chunk_id: (-scores[chunk_id], -rrf[chunk_id], chunk_id))
        candidates = [
            chunk_id
            for chunk_id in chunk_ids
            if min_similarity is None
            or (similarities.get(chunk_id) is not None and similarities[chunk_id] >= min_similarity)
        ]
        document_hits = _best_per_document(candidates) if group_by_document else None
        if document_hits is not None:
            candidates = list(document_hits)
        fused_values = dict(fused)
        selected = [
            (chunk_id, fused_values[chunk_id], score)
            for chunk_id, score in _monotone(candidates[:top_k], scores)
            if min_score is None or score >= min_score
        ]
        results = _results(selected, mode, keyword_scores, keyword_hits, vector_hits, similarities, document_hits)
    return SearchResponse(query=query, mode=mode, semantic_weight=weight, results=results, warnings=warnings)


# --- arguments -------------------------------------------------------------------------------


def validate_top_k(top_k: int | None, *, name: str = "top_k") -> None:
    if top_k is not None and not 1 <= top_k <= MAX_TOP_K:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"{name} must be between 1 and {MAX_TOP_K}")


def _collections(names: Sequence[str] | None) -> list[Collection]:
    queryset = Collection.objects.select_related("embedding_model")
    if names is None:
        return list(queryset.order_by("pk"))
    names = [names] if isinstance(names, str) else list(names)
    found = {collection.name: collection for collection in queryset.filter(name__in=names)}
    missing = [name for name in names if name not in found]
    if missing:
        raise KBError(ErrorCode.COLLECTION_NOT_FOUND, f"Collection not found: {', '.join(missing)}")
    return [found[name] for name in dict.fromkeys(names)]


def _content_types(content_types: Sequence[str]) -> list[str]:
    unknown = [kind for kind in content_types if kind not in CONTENT_TYPES]
    if unknown:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"Unknown content type(s) in filter: {', '.join(unknown)}")
    return list(content_types)


def _settings(
    top_k: int | None, mode: str | None, weight: float | None, targets: list[Collection]
) -> tuple[int, Mode, float]:
    """What the caller left out: the collection's own choice when one is searched, else the server's."""
    own = targets[0] if len(targets) == 1 else None
    if top_k is None:
        top_k = own.search_top_k if own else DEFAULT_TOP_K
    if mode is None:
        mode = "keyword" if own and not own.search_hybrid else "hybrid"
    if mode == "keyword":
        weight = 0.0
    elif mode == "semantic":
        weight = 1.0
    elif weight is None:
        weight = own.semantic_weight if own and own.semantic_weight is not None else settings.KB_SEMANTIC_WEIGHT
    return top_k, mode, weight


MAX_FILTER_CONDITIONS = 32
MAX_FILTER_VALUES = 1000
# Document ids a search may be limited to (each is a value of one ANY(...) array).
MAX_FILTER_DOCUMENTS = 10_000


def _parse_metadata_filter(metadata: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``{"author": "Smith", "year": {"$gte": 2020}, "lang": {"$in": ["en", "de"]}}``."""
    if not isinstance(metadata, dict):
        raise KBError(ErrorCode.INVALID_ARGUMENT, "The metadata filter must be an object")
    conditions = []
    for key, condition in metadata.items():
        if not isinstance(key, str) or not key:
            raise KBError(ErrorCode.INVALID_ARGUMENT, "Metadata filter keys must be non-empty strings")
        operators = condition if isinstance(condition, dict) else {"$eq": condition}
        if not operators:
            raise KBError(ErrorCode.INVALID_ARGUMENT, f"The filter on {key!r} has no condition")
        for operator, value in operators.items():
            if operator not in METADATA_OPERATORS:
                raise KBError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"Unknown filter operator {operator!r} on {key!r}; use one of {', '.join(METADATA_OPERATORS)}",
                )
            if operator == "$in" and not isinstance(value, list):
                raise KBError(ErrorCode.INVALID_ARGUMENT, f"$in on {key!r} needs a list")
            if operator in ("$gt", "$gte", "$lt", "$lte") and (
                isinstance(value, bool) or not isinstance(value, int | float | str)
            ):
                raise KBError(ErrorCode.INVALID_ARGUMENT, f"{operator} on {key!r} needs a number or a string")
            conditions.append((key, operator, value))
    if len(conditions) > MAX_FILTER_CONDITIONS or sum(_values(value) for *_, value in conditions) > MAX_FILTER_VALUES:
        # Each condition is a clause of the vector scan's filter: thousands of them cost Postgres
        # gigabytes of memory per query.
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"The metadata filter is too large: at most {MAX_FILTER_CONDITIONS} conditions "
            f"and {MAX_FILTER_VALUES} values in all",
        )
    return conditions


def _values(value: Any) -> int:
    return len(value) if isinstance(value, list) else 1


def _metadata_clause(column: str, key: str, operator: str, value: Any) -> tuple[str, list[Any]]:
    import json

    field = f"({column} -> %s)"
    if operator == "$eq":
        return f"{field} = %s::jsonb", [key, json.dumps(value)]
    if operator == "$ne":
        return f"({field} IS NOT NULL AND {field} <> %s::jsonb)", [key, key, json.dumps(value)]
    if operator == "$in":
        return f"{field} = ANY(%s::jsonb[])", [key, [json.dumps(item) for item in value]]
    comparison = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}[operator]
    if isinstance(value, str):  # strings (ISO dates too) compare as text, and only with strings
        return (
            f"(jsonb_typeof({field}) = 'string' AND ({column} ->> %s) {comparison} %s)",
            [key, key, value],
        )
    return (
        f"(jsonb_typeof({field}) = 'number' AND ({column} ->> %s)::numeric {comparison} %s)",
        [key, key, value],
    )


# --- BM25 ------------------------------------------------------------------------------------


def query_terms(query: str) -> dict[str, int]:
    """Stemmed query terms with their counts (a repeated term counts repeatedly)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lexeme, coalesce(array_length(positions, 1), 1) FROM unnest(to_tsvector('english', %s))",
            [query],
        )
        return dict(cursor.fetchall())


@dataclass(frozen=True)
class _KeywordQuery:
    """A query's BM25 terms over the searched chunks, and its ``full_match`` scale."""

    scorer: "_BM25Scorer | None"
    full_match: float

    @classmethod
    def of(cls, query: str, filters: Filters) -> "_KeywordQuery":
        """Okapi BM25 with Lucene's idf, over the statistics of exactly the collections searched."""
        terms = query_terms(query)
        if not terms or not filters.collection_ids:
            return cls(scorer=None, full_match=0.0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(chunk_count), 0)::float8, coalesce(sum(total_length), 0)::float8 "
                "FROM kb_collection_stats WHERE collection_id = ANY(%s)",
                [list(filters.collection_ids)],
            )
            chunk_total, length_total = cursor.fetchone()
            if not chunk_total:
                return cls(scorer=None, full_match=0.0)
            cursor.execute(
                "SELECT term, sum(df)::float8 FROM kb_term_stats "
                "WHERE collection_id = ANY(%s) AND term = ANY(%s) GROUP BY term",
                [list(filters.collection_ids), list(terms)],
            )
            frequencies = dict(cursor.fetchall())
        idf = {
            term: math.log(1 + (chunk_total - frequencies.get(term, 0) + 0.5) / (frequencies.get(term, 0) + 0.5))
            for term in terms
        }
        # One occurrence in a chunk of average length adds weight / (1 + k1) (see _BM25Scorer._score).
        full_match = sum(count * idf[term] for term, count in terms.items()) / (1 + settings.KB_BM25_K1)
        weights = {term: count * idf[term] for term, count in terms.items() if frequencies.get(term)}
        scorer = _BM25Scorer(filters, weights, frequencies, avgdl=length_total / chunk_total) if weights else None
        return cls(scorer=scorer, full_match=full_match)

    def top(self, depth: int) -> list[tuple[int, float]]:
        """The ``depth`` best chunks by BM25, best first."""
        return self.scorer.top(depth) if self.scorer else []

    def scores(self, chunk_ids: list[int]) -> dict[int, float]:
        """BM25 of just these chunks (those holding no query term are left out: their score is 0)."""
        if not self.scorer or not chunk_ids:
            return {}
        return self.scorer._score(list(self.scorer.weights), chunk_ids=chunk_ids)


@dataclass
class _BM25Scorer:
    """Exact top-k BM25 with MaxScore-style pruning.

    Terms are taken rarest first into the *essential* set until the postings read reach a
    budget. Only chunks holding an essential term are candidates; the other terms' weights are
    added for the best candidates by index look-ups. A chunk outside the candidates scores at
    most the sum of the other terms' upper bounds (a term adds less than its idf weight), and a
    candidate below the look-up cut at most its partial score plus that sum: when either could
    reach the k-th best score, the next term becomes essential and the query runs again.
    """

    filters: Filters
    weights: dict[str, float]
    frequencies: dict[str, int]
    avgdl: float

    def top(self, depth: int) -> list[tuple[int, float]]:
        ordered = sorted(self.weights, key=lambda term: self.frequencies[term])
        essential_count = 1
        read = self.frequencies[ordered[0]]
        while essential_count < len(ordered) and read + self.frequencies[ordered[essential_count]] <= POSTINGS_BUDGET:
            read += self.frequencies[ordered[essential_count]]
            essential_count += 1
        while True:
            essential, rest = ordered[:essential_count], ordered[essential_count:]
            result = self._attempt(essential, rest, depth)
            if result is not None:
                return result
            essential_count += 1

    def _attempt(self, essential: list[str], rest: list[str], depth: int) -> list[tuple[int, float]] | None:
        rest_bound = sum(self.weights[term] for term in rest)
        partial = self._score(essential, chunk_ids=None)
        if not rest:
            return sorted(partial.items(), key=lambda item: -item[1])[:depth]
        ranked = sorted(partial.items(), key=lambda item: -item[1])
        cut = max(depth * 4, 200)
        probed, unprobed = ranked[:cut], ranked[cut:]
        full = dict(probed)
        for chunk_id, extra in self._score(rest, chunk_ids=[chunk_id for chunk_id, _ in probed]).items():
            full[chunk_id] += extra
        best = sorted(full.items(), key=lambda item: -item[1])[:depth]
        threshold = best[-1][1] if len(best) == depth else 0.0
        outsiders_could_win = rest_bound > threshold or (unprobed and unprobed[0][1] + rest_bound > threshold)
        return None if outsiders_could_win else best

    def _score(self, terms: list[str], chunk_ids: list[int] | None) -> dict[int, float]:
        """Sum of the BM25 contributions of ``terms`` per chunk (only ``chunk_ids`` when given)."""
        k1, b = settings.KB_BM25_K1, settings.KB_BM25_B
        params: list[Any] = [list(terms), [self.weights[term] for term in terms]]
        restrict = ""
        if chunk_ids is not None:
            restrict = "AND p.chunk_id = ANY(%s)"
        allowed, allowed_params = self._allowed_join()
        sql = f"""
            SELECT p.chunk_id, sum(q.weight * p.tf / (p.tf + %s * (1 - %s + %s * p.chunk_length / %s)))
            FROM unnest(%s::text[], %s::float8[]) AS q(term, weight)
            JOIN kb_posting p ON p.collection_id = ANY(%s) AND p.term = q.term {restrict}
            {allowed}
            GROUP BY p.chunk_id
        """
        params = [k1, b, b, self.avgdl, *params, list(self.filters.collection_ids)]
        if chunk_ids is not None:
            params.append(chunk_ids)
        params.extend(allowed_params)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return dict(cursor.fetchall())

    def _allowed_join(self) -> tuple[str, list[Any]]:
        if not self.filters.narrows_documents:
            return "", []
        where, params = self.filters.sql("d")
        return f"JOIN kb_chunk c ON c.id = p.chunk_id JOIN kb_document d ON d.id = c.document_id AND {where}", params


# --- vectors ---------------------------------------------------------------------------------


class _QueryEmbeddingCache:
    """LRU of query vectors per (provider, model, query): repeated queries are not re-embedded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def vector(self, model: EmbeddingModel, query: str) -> list[float]:
        key = (model.provider, model.name, query)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key]
        vector = embed_texts(model.provider, model.name, [query])[0]
        with self._lock:
            self.misses += 1
            self._items[key] = vector
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return vector


query_embeddings = _QueryEmbeddingCache(settings.KB_QUERY_CACHE_SIZE)


def _by_model(targets: list[Collection]) -> dict[int, tuple[EmbeddingModel, list[int]]]:
    groups: dict[int, tuple[EmbeddingModel, list[int]]] = {}
    for collection in targets:
        model = collection.embedding_model
        groups.setdefault(model.pk, (model, []))[1].append(collection.pk)
    return groups


def _vector_search(query: str, targets: list[Collection], filters: Filters, depth: int) -> dict[int, tuple[int, float]]:
    """chunk id -> (rank within its model's list, cosine similarity). One query vector per model."""
    hits: dict[int, tuple[int, float]] = {}
    for model, collection_ids in _by_model(targets).values():
        if not model.dimensions:
            continue  # nothing embedded with this model yet
        vector = query_embeddings.vector(model, query)
        scoped = Filters(collection_ids=tuple(collection_ids), **_document_filters(filters))
        for rank, (chunk_id, similarity) in enumerate(_nearest(model, vector, scoped, depth), start=1):
            hits[chunk_id] = (rank, similarity)
    return hits


def _document_filters(filters: Filters) -> dict[str, Any]:
    return {"document_ids": filters.document_ids, "content_types": filters.content_types, "metadata": filters.metadata}


def _nearest(model: EmbeddingModel, vector: list[float], filters: Filters, depth: int) -> list[tuple[int, float]]:
    expression = vector_expression(model, alias="e")
    query_vector = Vector(vector).to_text()
    with connection.cursor() as cursor:
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
        cursor.execute(f"SET LOCAL hnsw.ef_search = {max(settings.KB_HNSW_EF_SEARCH, depth)}")
        cursor.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        # relaxed_order may return neighbours slightly out of order: sort again outside.
        cursor.execute(
            f"""
            WITH nearest AS MATERIALIZED (
                SELECT e.chunk_id, {expression} <=> %s::vector({model.dimensions}) AS distance
                FROM kb_embedding e {document_join}
                WHERE e.model_id = %s AND e.collection_id = ANY(%s)
                ORDER BY distance LIMIT %s
            )
            SELECT chunk_id, 1 - distance FROM nearest ORDER BY distance
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
        ORDER BY similarity DESC LIMIT %s
        """,
        [query_vector, model.pk, list(filters.collection_ids), *params, depth],
    )
    return cursor.fetchall()


def _similarities(query: str, targets: list[Collection], chunk_ids: list[int]) -> dict[int, float]:
    """Cosine similarity of given chunks (found by keyword) to the query, where they have vectors."""
    if not chunk_ids:
        return {}
    similarities: dict[int, float] = {}
    for model, collection_ids in _by_model(targets).values():
        if not model.dimensions:
            continue
        try:
            vector = query_embeddings.vector(model, query)
        except EmbeddingError:
            continue
        expression = vector_expression(model, alias="e")
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT e.chunk_id, 1 - ({expression} <=> %s::vector({model.dimensions})) FROM kb_embedding e "
                "WHERE e.model_id = %s AND e.collection_id = ANY(%s) AND e.chunk_id = ANY(%s)",
                [Vector(vector).to_text(), model.pk, collection_ids, chunk_ids],
            )
            similarities.update(cursor.fetchall())
    return similarities


# --- fusion and results ----------------------------------------------------------------------


def _fuse(
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
class _Relevance:
    """The [0, 1] score: ``w * clip(cosine, 0, 1) + (1 - w) * min(1, bm25 / full_match)``."""

    full_match: float
    weight: float

    def of(self, similarity: float | None, bm25: float) -> float:
        semantic = min(1.0, max(0.0, similarity or 0.0))
        keyword = min(1.0, bm25 / self.full_match) if self.full_match else 0.0
        # Rounded as results show it, so a score read from a result is a threshold that keeps it.
        return round(self.weight * semantic + (1 - self.weight) * keyword, 6)


def _contenders(
    chunk_ids: list[int],
    keyword_hits: list[tuple[int, float]],
    vector_hits: dict[int, tuple[int, float]],
    relevance: _Relevance,
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


def _best_per_document(ranked: list[int]) -> dict[int, int]:
    """Each document's first chunk in ``ranked`` (in rank order) and the document's number of chunks there."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, document_id FROM kb_chunk WHERE id = ANY(%s)", [ranked])
        document_of = dict(cursor.fetchall())
    best: dict[str, int] = {}
    hits: dict[int, int] = {}
    for chunk_id in ranked:
        document = document_of.get(chunk_id)
        if document is None:  # deleted since it was ranked
            continue
        first = best.setdefault(document, chunk_id)
        hits[first] = hits.get(first, 0) + 1
    return hits


def _monotone(ranked: list[int], scores: dict[int, float]) -> list[tuple[int, float]]:
    """(chunk id, score) in rank order, each score capped by the one above it: under RRF order a
    score could otherwise rise down the list (under convex fusion the cap changes nothing)."""
    capped, ceiling = [], 1.0
    for chunk_id in ranked:
        ceiling = min(ceiling, scores[chunk_id])
        capped.append((chunk_id, ceiling))
    return capped


def _results(
    selected: list[tuple[int, float, float]],
    mode: str,
    keyword_scores: dict[int, float],
    keyword_hits: list[tuple[int, float]],
    vector_hits: dict[int, tuple[int, float]],
    similarities: dict[int, float],
    document_hits: dict[int, int] | None,
) -> list[SearchResult]:
    if not selected:
        return []
    keyword_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(keyword_hits, start=1)}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.id, c.content, c.index, c.line_start, c.line_end, c.page, c.token_count, c.metadata,
                   d.id, d.source_uri, d.title, d.content_type, d.metadata, col.name, c.heading_path
            FROM kb_chunk c
            JOIN kb_document d ON d.id = c.document_id
            JOIN kb_collection col ON col.id = c.collection_id
            WHERE c.id = ANY(%s)
            """,
            [[chunk_id for chunk_id, *_ in selected]],
        )
        rows = {row[0]: row for row in cursor.fetchall()}
    results = []
    for chunk_id, fused_score, score in selected:
        row = rows.get(chunk_id)
        if row is None:  # deleted between the ranking and now
            continue
        vector = vector_hits.get(chunk_id)
        results.append(
            SearchResult(
                rank=len(results) + 1,
                score=score,
                fused_score=round(float(fused_score), 6) if mode == "hybrid" else None,
                similarity=_rounded(similarities.get(chunk_id)),
                vector_rank=vector[0] if vector else None,
                keyword_rank=keyword_ranks.get(chunk_id),
                keyword_score=_rounded(keyword_scores.get(chunk_id)),
                chunk_id=chunk_id,
                content=row[1],
                chunk_index=row[2],
                line_start=row[3],
                line_end=row[4],
                page=row[5],
                token_count=row[6],
                chunk_metadata=_json(row[7]),
                document_id=row[8],
                source_uri=row[9],
                title=row[10],
                content_type=row[11],
                metadata=_json(row[12]),
                collection=row[13],
                heading_path=list(row[14] or []),
                document_hits=None if document_hits is None else document_hits[chunk_id],
            )
        )
    return results


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _json(value: Any) -> dict[str, Any]:
    import json

    if isinstance(value, str):
        return json.loads(value)
    return value or {}
