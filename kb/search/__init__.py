"""Search, one service for every front door (admin playground, API, MCP, ``kb_search``).

- ``service``: ``search`` itself, its arguments and the defaults a collection gives them;
- ``filters``: which collections and documents are searched;
- ``bm25``: keyword ranking over the postings;
- ``vectors``: similarity over each embedding model's HNSW index, and the query-vector cache;
- ``fusion``: ranking the union of both lists;
- ``results``: the result shape, loaded for the chunks selected.

Every read runs on a caught-up streaming replica when there is one (``kb.replicas``).
"""

from kb.search.bm25 import query_terms
from kb.search.results import MODES, Mode, SearchResponse, SearchResult
from kb.search.service import FUSIONS, MAX_CANDIDATE_DEPTH, Fusion, search, validate_top_k
from kb.search.vectors import query_embeddings

__all__ = [
    "FUSIONS",
    "MAX_CANDIDATE_DEPTH",
    "MODES",
    "Fusion",
    "Mode",
    "SearchResponse",
    "SearchResult",
    "query_embeddings",
    "query_terms",
    "search",
    "validate_top_k",
]
