"""Search, statistics and health."""

from django.http import HttpRequest
from ninja import Query, Router, Status

from kb.api.auth import access_of, sees_health_details
from kb.api.errors import with_errors
from kb.api.schemas import HealthOut, SearchIn, StatsQuery
from kb.errors import ErrorCode
from kb.models import TokenScope
from kb.search import SearchResponse, search
from kb.selectors.health import health_report
from kb.selectors.stats import Stats, kb_stats

router = Router(tags=["search"])


@router.post(
    "/search",
    response=with_errors({200: SearchResponse}, ErrorCode.COLLECTION_NOT_FOUND, ErrorCode.EMBEDDING_ERROR),
    summary="Search: hybrid (BM25 + vectors, ranked by the evidence of both), semantic or keyword",
    description="Without `collections`, searches every collection the token can see. In hybrid mode an "
    "unreachable embedding provider degrades to keyword results with a warning; in semantic mode it is "
    "EMBEDDING_ERROR.",
)
def search_chunks(request: HttpRequest, payload: SearchIn) -> SearchResponse:
    access = access_of(request)
    access.require(TokenScope.READ)
    response = search(
        query=payload.query,
        collections=access.search_collections(payload.collections),
        top_k=payload.top_k,
        mode=payload.mode,
        semantic_weight=payload.semantic_weight,
        min_score=payload.min_score,
        min_similarity=payload.min_similarity,
        document_ids=payload.document_ids,
        content_types=payload.content_types,
        metadata=payload.metadata,
        candidate_depth=payload.candidate_depth,
        group_by_document=payload.group_by_document,
    )
    return response


@router.get(
    "/stats",
    response=with_errors({200: Stats}, ErrorCode.COLLECTION_NOT_FOUND),
    summary="Counts of collections, documents, chunks and embeddings, and storage used",
)
def stats(request: HttpRequest, query: Query[StatsQuery]) -> Stats:
    access = access_of(request)
    access.require(TokenScope.READ)
    if query.collection is None:
        access.require_unrestricted("read server-wide statistics")
    else:
        access.check_collection(query.collection)
    return kb_stats(collection=query.collection)


@router.get(
    "/health",
    auth=None,
    response={200: HealthOut, 503: HealthOut},
    summary="Whether the database, the broker and the embedding providers are reachable (no token needed)",
    description="Anyone sees which checks pass; the details (versions, hosts, paths, errors) need admin access.",
)
def health(request: HttpRequest) -> Status[HealthOut]:
    report = health_report(detailed=sees_health_details(request))
    return Status(503 if report["status"] == "error" else 200, HealthOut(**report))
