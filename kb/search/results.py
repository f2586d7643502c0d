"""What a search returns: the one result shape every door shows, loaded for the chunks selected."""

import json
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, computed_field

from kb.replicas import read_connection

Mode = Literal["hybrid", "semantic", "keyword"]
MODES: tuple[str, ...] = get_args(Mode)


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


def best_per_document(ranked: list[int]) -> dict[int, int]:
    """Each document's first chunk in ``ranked`` (in rank order) and the document's number of chunks there."""
    with read_connection().cursor() as cursor:
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


def load_results(
    selected: list[tuple[int, float, float]],
    mode: str,
    keyword_scores: dict[int, float],
    keyword_hits: list[tuple[int, float]],
    vector_hits: dict[int, tuple[int, float]],
    similarities: dict[int, float],
    document_hits: dict[int, int] | None,
) -> list[SearchResult]:
    """The selected (chunk id, fused score, score) as results, with their chunks' text and place."""
    if not selected:
        return []
    keyword_ranks = {chunk_id: rank for rank, (chunk_id, _) in enumerate(keyword_hits, start=1)}
    with read_connection().cursor() as cursor:
        cursor.execute(
            """
            SELECT c.id AS chunk_id, c.content, c.index AS chunk_index, c.line_start, c.line_end, c.page,
                   c.token_count, c.metadata AS chunk_metadata, c.heading_path, d.id AS document_id,
                   d.source_uri, d.title, d.content_type, d.metadata, col.name AS collection
            FROM kb_chunk c
            JOIN kb_document d ON d.id = c.document_id
            JOIN kb_collection col ON col.id = c.collection_id
            WHERE c.id = ANY(%s)
            """,
            [[chunk_id for chunk_id, *_ in selected]],
        )
        columns = [column.name for column in cursor.description]
        rows = {row["chunk_id"]: row for row in (dict(zip(columns, values, strict=True)) for values in cursor)}
    results = []
    for chunk_id, fused_score, score in selected:
        row = rows.get(chunk_id)
        if row is None:  # deleted between the ranking and now
            continue
        vector = vector_hits.get(chunk_id)
        results.append(
            SearchResult(
                **row
                | {
                    "metadata": _json(row["metadata"]),
                    "chunk_metadata": _json(row["chunk_metadata"]),
                    "heading_path": row["heading_path"] or [],
                },
                rank=len(results) + 1,
                score=score,
                fused_score=round(float(fused_score), 6) if mode == "hybrid" else None,
                similarity=_rounded(similarities.get(chunk_id)),
                vector_rank=vector[0] if vector else None,
                keyword_rank=keyword_ranks.get(chunk_id),
                keyword_score=_rounded(keyword_scores.get(chunk_id)),
                document_hits=None if document_hits is None else document_hits[chunk_id],
            )
        )
    return results


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _json(value: Any) -> dict[str, Any]:
    """jsonb as Django's cursor returns it (text), or already decoded."""
    if isinstance(value, str):
        return json.loads(value)
    return value or {}
