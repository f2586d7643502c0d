"""The hybrid-search profile (seed 002): search_documents(query, top_k=3) over every collection,
vector and keyword rankings fused with RRF at semantic weight 0.7, and grounded_qa_prompt.
Errors reach the agent as an error result with the message."""

from typing import Annotated

from pydantic import Field
from typing_extensions import TypedDict

from kb.models import MAX_TOP_K, TokenScope
from kb.search import search
from mcp_endpoint.budget import fit_list
from mcp_endpoint.caller import current_access
from mcp_endpoint.servers import prompts
from mcp_endpoint.servers.rag_shapes import file_name
from mcp_endpoint.tooling import READ_ONLY, KBServer, raise_tool_error, service_tool

SEMANTIC_WEIGHT = 0.7


class HybridHit(TypedDict):
    file_name: str
    content: str
    rrf_score: float
    score: float  # the seed's own test script prints doc["score"]: the 0-1 relevance (README, Search)
    vector_rank: int | None
    text_rank: int | None


@service_tool(TokenScope.READ, on_error=raise_tool_error)
def search_documents(
    query: Annotated[str, Field(description="The search query text to find relevant documents")],
    top_k: Annotated[int, Field(description="The maximum number of results to return")] = 3,
) -> list[HybridHit]:
    """Perform hybrid search on indexed documents: vector similarity and keyword matching combined with
    Reciprocal Rank Fusion. Returns the matching documents ordered by relevance."""
    access = current_access()
    response = search(
        query=query,
        collections=access.search_collections(None),
        top_k=min(top_k, MAX_TOP_K),  # the seed sets no maximum: at most the server's
        mode="hybrid",
        semantic_weight=SEMANTIC_WEIGHT,
        fusion="rrf",  # the seed orders by its RRF score
    )
    hits = [
        HybridHit(
            file_name=file_name(result.source_uri),
            content=result.content,
            rrf_score=result.fused_score or 0.0,
            score=result.score,
            vector_rank=result.vector_rank,
            text_rank=result.keyword_rank,
        )
        for result in response.results
    ]
    fit_list(hits, "content")
    return hits


def build(*, read_only: bool) -> KBServer:
    server = KBServer("rag_server")
    server.add_tools([(search_documents, READ_ONLY)], read_only=read_only)
    prompts.register(server, citations=False)
    return server
