"""REST API: search with every argument of the search service, and statistics."""

from unittest.mock import ANY

import pytest

from kb.errors import KBError
from kb.models import Collection
from kb.search import search as search_service
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from tests.conftest import free_port
from tests.support.api_helpers import error_of, get, patch, post
from tests.support.documents import MARKDOWN, PYTHON
from tests.support.fake_providers import remote_collection
from tests.support.worker import embed_now

pytestmark = pytest.mark.django_db


@pytest.fixture
def library():
    """Two collections with embedded documents: a Markdown guide, Python code and a note."""
    docs = collection_create(name="docs")
    code = collection_create(name="code")
    stored = {
        "guide": document_create_from_text(
            collection=docs,
            source_uri="file:///guide.md",
            text=MARKDOWN,
            content_type="markdown",
            metadata={"author": "Smith", "year": 2024, "lang": "en"},
        ),
        "note": document_create_from_text(
            collection=docs,
            source_uri="note://replicas",
            text="Replicas of the web server share nothing but the database.",
            metadata={"author": "Lee", "year": 2019, "lang": "de"},
        ),
        "retry": document_create_from_text(
            collection=code, source_uri="file:///retry.py", text=PYTHON, content_type="python"
        ),
    }
    return {name: embed_now(item.document.pk) for name, item in stored.items()}


def search(client, token=None, **body):
    return post(client, "/api/search", body, token)


def test_hybrid_search_finds_the_passage_with_every_result_field(client, library):
    response = search(client, query="How do I upgrade replicas one at a time?", top_k=3)
    assert response.status_code == 200
    body = response.json()
    assert (body["query"], body["mode"], body["warnings"]) == ("How do I upgrade replicas one at a time?", "hybrid", [])
    assert body["total_results"] == len(body["results"]) <= 3
    best = body["results"][0]
    assert "Upgrade one replica at a time" in best["content"]
    assert (best["rank"], best["collection"], best["source_uri"]) == (1, "docs", "file:///guide.md")
    assert best["similarity"] is not None and best["keyword_rank"] is not None and best["vector_rank"] is not None
    assert best["lines"] == f"{best['line_start']}-{best['line_end']}"
    assert best["metadata"]["author"] == "Smith"
    assert (best["heading_path"], best["document_hits"]) == (["Deployment guide"], None)


def test_a_search_can_return_one_result_per_document(client):
    docs = collection_create(name="docs", chunk_max_tokens=24, chunk_min_tokens=0)
    text = "\n\n".join(f"Replica {n} of the web server shares nothing but the database." for n in range(4))
    many = document_create_from_text(collection=docs, source_uri="note://many", text=text).document
    document_create_from_text(collection=docs, source_uri="note://one", text="A replica of the database.")
    plain = search(client, query="replica database", mode="keyword").json()["results"]
    grouped = search(client, query="replica database", mode="keyword", group_by_document=True).json()["results"]
    assert len(plain) == many.chunk_count + 1 > 2
    assert [(hit["source_uri"], hit["document_hits"]) for hit in grouped] == [
        (plain[0]["source_uri"], many.chunk_count if plain[0]["source_uri"] == "note://many" else 1),
        (next(hit["source_uri"] for hit in plain if hit["source_uri"] != plain[0]["source_uri"]), ANY),
    ]
    assert sorted(hit["document_hits"] for hit in grouped) == [1, many.chunk_count]


def test_a_collection_s_search_settings_apply_when_the_request_leaves_them_out(client, library):
    patched = patch(client, "/api/collections/docs", {"search_top_k": 1, "search_hybrid": False})
    assert patched.status_code == 200, patched.content
    own = search(client, query="replicas", collections=["docs"]).json()
    assert (own["mode"], own["total_results"]) == ("keyword", 1)
    both = search(client, query="replicas", collections=["docs", "code"]).json()
    assert both["mode"] == "hybrid" and both["total_results"] > 1


def test_keyword_mode_searches_by_words_alone(client, library):
    keyword = search(client, query="Backoff delay", mode="keyword").json()
    assert keyword["semantic_weight"] == 0.0
    assert keyword["results"][0]["source_uri"] == "file:///retry.py"
    assert all(result["vector_rank"] is None for result in keyword["results"])


def test_semantic_mode_searches_by_meaning_alone(client, library):
    semantic = search(client, query="retrying a failing call with exponential waits", mode="semantic").json()
    assert semantic["semantic_weight"] == 1.0
    assert semantic["results"][0]["source_uri"] == "file:///retry.py"


def test_filters_narrow_the_results(client, library):
    query = "replicas web server database"
    only_code = search(client, query="retry", collections=["code"]).json()["results"]
    assert {r["collection"] for r in only_code} == {"code"}
    by_document = search(client, query=query, document_ids=[library["note"].pk]).json()["results"]
    assert {r["document_id"] for r in by_document} == {library["note"].pk}
    by_type = search(client, query=query, content_types=["markdown"]).json()["results"]
    assert by_type and {r["content_type"] for r in by_type} == {"markdown"}
    by_metadata = search(client, query=query, metadata={"year": {"$gte": 2020}, "lang": {"$in": ["en"]}}).json()
    assert by_metadata["results"] and {r["metadata"]["author"] for r in by_metadata["results"]} == {"Smith"}
    assert search(client, query=query, metadata={"author": "Nobody"}).json()["results"] == []
    strict = search(client, query=query, min_similarity=0.99, candidate_depth=200).json()
    assert strict["results"] == []
    high_score = search(client, query=query, min_score=1.0).json()
    assert high_score["results"] == []
    weighted = search(client, query=query, semantic_weight=0.2).json()
    assert weighted["semantic_weight"] == 0.2


@pytest.mark.parametrize(
    "body",
    [
        {"query": ""},
        {"query": "x", "top_k": 0},
        {"query": "x", "top_k": 101},
        {"query": "x", "mode": "fuzzy"},
        {"query": "x", "semantic_weight": 2},
        {"query": "x", "content_types": ["cobol"]},
        {"query": "x", "metadata": {"year": {"$regex": "."}}},
        {"top_k": 3},
        # A JSON body is typed as JSON types it, as MCP's rag_search takes it: no coercion.
        {"query": "x", "top_k": "5"},
        {"query": "x", "top_k": True},
        {"query": "x", "top_k": 5.0},
        {"query": "x", "semantic_weight": "0.5"},
        {"query": "x", "semantic_weight": True},
        {"query": "x", "group_by_document": "true"},
        {"query": "x", "group_by_document": 1},
        {"query": 5},
    ],
)
def test_invalid_search_arguments_are_400(client, body):
    assert error_of(post(client, "/api/search", body)) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    "arguments",
    [
        {"query": " "},
        {"query": "x", "top_k": 0},
        {"query": "x", "min_score": 2},
        {"query": "x", "content_types": ["nope"]},
        {"query": "x", "document_ids": ["A"] * 10_001},
        {"query": "x", "collections": ["a"] * 1_001},
        {"query": "x" * 10_001},
    ],
    ids=["empty", "top_k", "min_score", "content type", "document ids", "collections", "query length"],
)
def test_rest_refuses_a_search_with_the_service_s_own_message(client, arguments):
    with pytest.raises(KBError) as refused:
        search_service(**arguments)
    response = post(client, "/api/search", arguments)
    assert (response.status_code, response.json()["error"]) == (400, refused.value.as_dict()["error"])


def test_the_query_length_limit_is_kb_max_query_chars_at_every_door(client, settings):
    settings.KB_MAX_QUERY_CHARS = 20_000
    collection_create(name="long")
    assert post(client, "/api/search", {"query": "wing " * 3_000, "collections": ["long"]}).status_code == 200


def test_searching_an_unknown_collection_is_404(client):
    assert error_of(search(client, query="x", collections=["nope"])) == (404, "COLLECTION_NOT_FOUND")


def test_semantic_search_with_an_unreachable_provider_is_500_embedding_error(client, settings):
    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    remote = remote_collection(settings, name="remote")
    document_create_from_text(collection=remote, source_uri="note://a", text="Wind tunnel results.")
    response = search(client, query="wind tunnel", collections=["remote"], mode="semantic")
    assert error_of(response) == (500, "EMBEDDING_ERROR")
    degraded = search(client, query="wind tunnel", collections=["remote"]).json()
    assert degraded["results"] and "keyword results only" in degraded["warnings"][0]


def test_stats_count_everything_or_one_collection(client, library):
    everything = get(client, "/api/stats").json()
    assert (everything["collections"], everything["documents"], everything["filter"]) == (2, 3, None)
    assert everything["embeddings"] == everything["chunks"] > 0
    assert everything["storage_bytes"] > 0
    code = get(client, "/api/stats", collection="code").json()
    assert (code["collections"], code["documents"], code["filter"]) == (1, 1, "code")
    # one collection's size is its own rows': another growing does not show in it
    assert 0 < code["storage_bytes"] < everything["storage_bytes"]
    docs = Collection.objects.get(name="docs")
    text = " ".join(f"word{n}" for n in range(20_000))
    document_create_from_text(collection=docs, source_uri="note://big", text=text)
    assert get(client, "/api/stats", collection="code").json()["storage_bytes"] == code["storage_bytes"]
    assert get(client, "/api/stats", collection="docs").json()["storage_bytes"] > 50_000
    assert error_of(get(client, "/api/stats", collection="nope")) == (404, "COLLECTION_NOT_FOUND")
