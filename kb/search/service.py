"""Search: BM25 keyword ranking and pgvector similarity, fused by the evidence of both.

One service for every front door (admin playground, API, MCP, ``kb_search``):

- ``keyword``: Okapi BM25 over the postings the database maintains (kb/migrations/0002), with
  the collection statistics of exactly the collections searched. Exact, with MaxScore-style
  pruning: the rare terms are scored over their whole posting lists, the common ones only for
  the candidates, and the pruning is undone whenever it could change the top results.
- ``semantic``: cosine similarity with the HNSW index of each collection's embedding model,
  iterative index scans so that filtered queries still fill ``top_k``; an exact scan when a
  filter leaves few chunks.
- ``hybrid`` (default): both lists, each ``candidate_depth`` deep; every chunk of either list
  gets both its cosine and its BM25 and the union is ranked by evidence in nats
  (``fusion="evidence"``, kb.search.fusion.Evidence): ``w`` times how unlikely the cosine is among
  the chunks of the collections searched (their background, kb.search.background) plus ``1 - w``
  times BM25 on its log-odds scale. A weak model's or a narrow collection's high cosines are common there and
  count for little, so hybrid follows the stronger half (README, Retrieval quality). Below
  MIN_BACKGROUND_CHUNKS chunks, or across collections of several models, it ranks by ``score``
  (below), a convex combination of the two normalised by their theoretical ranges
  (``fusion="convex"``). ``fusion="rrf"`` ranks by weighted Reciprocal Rank Fusion instead (seed
  002's contract).

Every result's ``score`` is one relevance scale in [0, 1] whatever the mode, so that one threshold
(``min_score``, or a client keeping ``score > 0.5``) means the same in each:
``score = w * clip(cosine, 0, 1) + (1 - w) * min(1, bm25 / full_match)``, where ``full_match`` is
the BM25 value of a chunk of average length that holds every query term once (so 1.0 = all the
query's words are there; terms found nowhere count against it too) and ``w`` is 1 for semantic, 0
for keyword, the semantic weight for hybrid. Under evidence or RRF order a result's score is capped
by the one above it, so scores never rise with the rank and a threshold cuts the list at one place.
The raw values stay: ``similarity`` (cosine), ``keyword_score`` (BM25), and in hybrid mode
``fused_score``, the weighted RRF value ``2w/(k + vector_rank) + 2(1-w)/(k + keyword_rank)``.

Filters fail closed: an unknown collection is an error, an empty list of documents matches
nothing, an unknown operator is INVALID_ARGUMENT.

``top_k``, ``mode`` and ``semantic_weight`` left out take the searched collection's own search
settings (search_top_k; search_hybrid false means keyword; semantic_weight) when one collection is
searched, and the server's defaults (10, hybrid, KB_SEMANTIC_WEIGHT) across several.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from django.conf import settings

from kb.embedding_providers import EmbeddingError
from kb.errors import ErrorCode, KBError
from kb.models import DEFAULT_TOP_K, MAX_TOP_K, Collection
from kb.replicas import read_snapshot, reads_from_replica
from kb.search.background import backgrounds
from kb.search.bm25 import KeywordQuery
from kb.search.filters import (
    MAX_FILTER_DOCUMENTS,
    MAX_FILTER_VALUES,
    Filters,
    checked_content_types,
    parse_metadata_filter,
    target_collections,
)
from kb.search.fusion import Evidence, Relevance, contenders, fuse, monotone
from kb.search.results import MODES, Mode, SearchResponse, best_per_document, load_results
from kb.search.vectors import by_model, query_embeddings, similarities_of, vector_search
from kb.storable import check_storable

Fusion = Literal["evidence", "convex", "rrf"]
FUSIONS: tuple[str, ...] = get_args(Fusion)
MIN_CANDIDATE_DEPTH = 100
# A semantic list reads this far past its top k: the graph search cuts among equal distances
# (copies of one text) wherever its walk took it, so the copies are sorted by chunk id past the cut.
SEMANTIC_TIE_MARGIN = 10
MAX_CANDIDATE_DEPTH = 10_000
# Grouped by document, a search whose lists were cut before top_k documents looks this many times deeper.
GROUPING_WIDENING = 4


@reads_from_replica
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
    fusion: str = "evidence",
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
    if document_ids is not None and len(document_ids) > MAX_FILTER_DOCUMENTS:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"At most {MAX_FILTER_DOCUMENTS} document ids per search")
    if collections is not None and len(collections) > MAX_FILTER_VALUES:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"At most {MAX_FILTER_VALUES} collections per search")
    if content_types is not None and len(content_types) > MAX_FILTER_VALUES:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"At most {MAX_FILTER_VALUES} content types per search")
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
    targets = target_collections(collections)
    top_k, mode, weight = _settings(top_k, mode, semantic_weight, targets)
    filters = Filters(
        collection_ids=tuple(collection.pk for collection in targets),
        document_ids=None if document_ids is None else tuple(str(doc).upper() for doc in document_ids),  # ULIDs
        content_types=None if content_types is None else tuple(checked_content_types(content_types)),
        metadata=tuple(parse_metadata_filter(metadata or {})),
    )
    if mode == "hybrid" or group_by_document:  # fusion and grouping look past the top k
        depth = max(MIN_CANDIDATE_DEPTH, 3 * top_k)
    else:
        depth = top_k + SEMANTIC_TIE_MARGIN if mode == "semantic" else top_k
    depth = max(candidate_depth or 0, depth)
    if not targets:
        return SearchResponse(query=query, mode=mode, semantic_weight=weight, results=[])

    with read_snapshot():  # one snapshot for ranking and loading; SET LOCAL needs a transaction too
        keyword = KeywordQuery.of(query, filters) if mode in ("keyword", "hybrid") and weight < 1.0 else None
        while True:
            ranking = _rank(
                query,
                targets,
                filters,
                keyword,
                mode,
                weight,
                fusion,
                depth,
                top_k,
                min_similarity,
                complete=min_similarity is not None or group_by_document,
            )
            candidates = ranking.candidates
            document_hits = best_per_document(candidates) if group_by_document else None
            filled = document_hits is None or len(document_hits) >= top_k
            if filled or not ranking.cut_at(depth) or depth >= MAX_CANDIDATE_DEPTH:
                break
            # A few documents' chunks filled the lists: look deeper for others.
            depth = min(MAX_CANDIDATE_DEPTH, depth * GROUPING_WIDENING)
        if document_hits is not None:
            candidates = list(document_hits)
        fused_values = dict(ranking.fused)
        selected = [
            (chunk_id, fused_values[chunk_id], score)
            for chunk_id, score in monotone(candidates[:top_k], ranking.scores)
            if min_score is None or score >= min_score
        ]
        results = load_results(
            selected,
            mode,
            ranking.keyword_scores,
            ranking.keyword_hits,
            ranking.vector_hits,
            ranking.similarities,
            document_hits,
        )
    return SearchResponse(query=query, mode=mode, semantic_weight=weight, results=results, warnings=ranking.warnings)


@dataclass
class _Ranking:
    """Both lists of one search and the chunks they rank, best first."""

    keyword_hits: list[tuple[int, float]]
    vector_hits: dict[int, tuple[int, float]]
    fused: list[tuple[int, float]]
    scores: dict[int, float]
    similarities: dict[int, float]
    keyword_scores: dict[int, float]
    candidates: list[int]
    warnings: list[str]

    def cut_at(self, depth: int) -> bool:
        """Whether a list stopped at ``depth`` (more chunks match than it holds)."""
        return len(self.keyword_hits) >= depth or len(self.vector_hits) >= depth


def _rank(
    query: str,
    targets: list[Collection],
    filters: Filters,
    keyword: KeywordQuery | None,
    mode: Mode,
    weight: float,
    fusion: str,
    depth: int,
    top_k: int,
    min_similarity: float | None,
    *,
    complete: bool,
) -> _Ranking:
    """Rank ``depth`` candidates of each list. ``complete``: every candidate gets both halves of its
    score (grouping and a similarity floor look past the top k), not only those that could reach it."""
    warnings: list[str] = []
    keyword_hits = keyword.top(depth) if keyword else []
    vector_hits: dict[int, tuple[int, float]] = {}
    if mode in ("semantic", "hybrid") and weight > 0.0:
        try:
            vector_hits = vector_search(query, targets, filters, depth, ranked=mode == "semantic")
        except EmbeddingError as error:
            if mode == "semantic":
                raise
            warnings.append(f"Semantic search unavailable, keyword results only: {error.message}")
    fused = fuse(keyword_hits, vector_hits, weight, mode)
    chunk_ids = [chunk_id for chunk_id, _ in fused]
    # No vector list at all (provider down, nothing embedded yet): the score is keyword relevance.
    relevance = Relevance(keyword.full_match if keyword else 0.0, weight if vector_hits else 0.0)
    similarities = {chunk_id: sim for chunk_id, (_, sim) in vector_hits.items()}
    keyword_scores = dict(keyword_hits)
    scores = relevance.of_each(chunk_ids, similarities, keyword_scores)  # from the halves found so far
    by_value = mode == "hybrid" and fusion != "rrf"  # ranked by a value of both halves, not by ranks
    order: Relevance | Evidence = relevance
    if by_value and fusion == "evidence" and keyword_hits and vector_hits:
        order = _evidence(query, targets, keyword, weight) or relevance
    ranks = scores if order is relevance else order.of_each(chunk_ids, similarities, keyword_scores)
    if complete:
        completed = chunk_ids
    elif by_value:
        one_model = len(by_model(targets)) == 1
        completed = contenders(chunk_ids, ranks, keyword_scores, similarities, order, top_k, depth, one_model)
    else:  # RRF needs both scores only for what it shows
        completed = chunk_ids[:top_k]
    if min_similarity is not None or (mode == "hybrid" and vector_hits):
        # Chunks found only by keyword get their similarity too (the query is embedded already).
        similarities.update(similarities_of(query, targets, [c for c in completed if c not in similarities]))
    if keyword and mode == "hybrid":  # found by meaning only: their BM25 counts towards the score
        keyword_scores.update(keyword.scores([c for c in completed if c not in keyword_scores]))
    scores.update(relevance.of_each(completed, similarities, keyword_scores))
    if by_value:
        if order is not relevance:
            ranks.update(order.of_each(completed, similarities, keyword_scores))
        # Ties (full keyword matches, where the keyword part is capped at 1) keep their RRF order.
        rrf = dict(fused)
        chunk_ids.sort(key=lambda chunk_id: (-ranks[chunk_id], -rrf[chunk_id], chunk_id))
    candidates = [
        chunk_id
        for chunk_id in chunk_ids
        if min_similarity is None
        or (similarities.get(chunk_id) is not None and similarities[chunk_id] >= min_similarity)
    ]
    return _Ranking(keyword_hits, vector_hits, fused, scores, similarities, keyword_scores, candidates, warnings)


def _evidence(query: str, targets: list[Collection], keyword: KeywordQuery, weight: float) -> Evidence | None:
    """Evidence fusion for a search of one model's collections that hold enough chunks for their
    background to be known (kb.search.background); None otherwise: the convex order then."""
    groups = list(by_model(targets).values())
    if len(groups) != 1:  # each model's cosines against its own background: not built (README, Search)
        return None
    model, collection_ids = groups[0]
    background = backgrounds.of(model, collection_ids, keyword.chunks)
    if background is None:
        return None
    try:  # the vector the search embedded, unless the query cache is off or let it go meanwhile
        vector = query_embeddings.array(model, query, collection_ids)
    except EmbeddingError:
        return None
    mean, deviation = background.spread(vector)
    return Evidence(weight=weight, mean=mean, deviation=deviation)


def validate_top_k(top_k: int | None, *, name: str = "top_k") -> None:
    if top_k is not None and not 1 <= top_k <= MAX_TOP_K:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"{name} must be between 1 and {MAX_TOP_K}")


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
