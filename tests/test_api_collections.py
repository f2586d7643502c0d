"""REST API: collections (list, create, get, update settings and embedding model, delete)."""

import pytest

from kb.models import Collection, Document, EmbeddingModel
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from tests.conftest import free_port
from tests.support.api_helpers import delete, error_of, get, patch, post
from tests.support.fake_providers import fake_ollama

pytestmark = pytest.mark.django_db


def test_it_creates_a_collection_showing_its_settings_with_totals(client):
    response = post(client, "/api/collections", {"name": "docs", "description": "Guides", "chunk_max_tokens": 256})
    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "docs"
    assert body["description"] == "Guides"
    assert body["settings"]["chunking"] == {"max_tokens": 256, "min_tokens": 50, "overlap_tokens": 0}
    assert body["settings"]["search"] == {"top_k": 10, "hybrid": True, "semantic_weight": None}
    assert body["embedding_model"] == {"provider": "local", "name": "all-MiniLM-L6-v2", "dimensions": 384}
    assert body["next_embedding_model"] is None
    assert body["documents"] == {"total": 0, "pending": 0, "processing": 0, "ready": 0, "failed": 0}
    assert Collection.objects.filter(name="docs").exists()


def test_it_lists_collections_with_their_totals(client):
    docs = collection_create(name="docs")
    collection_create(name="code", description="Source")
    document_create_from_text(collection=docs, source_uri="note://a", text="Alpha text.")
    body = get(client, "/api/collections").json()
    assert body["total"] == 2
    assert [c["name"] for c in body["collections"]] == ["code", "docs"]
    assert body["collections"][1]["documents"] == 1
    assert body["collections"][1]["chunks"] == 1


def test_getting_a_collection_counts_its_documents_by_status(client):
    docs = collection_create(name="docs")
    document_create_from_text(collection=docs, source_uri="note://a", text="Alpha text.")
    failed = document_create_from_text(collection=docs, source_uri="note://b", text="Beta text.").document
    Document.objects.filter(pk=failed.pk).update(status="failed")
    body = get(client, "/api/collections/docs").json()
    assert body["documents"] == {"total": 2, "pending": 1, "processing": 0, "ready": 0, "failed": 1}
    assert body["chunks"] == 2


def test_an_unknown_collection_is_404_collection_not_found(client):
    assert error_of(get(client, "/api/collections/nope")) == (404, "COLLECTION_NOT_FOUND")
    assert error_of(patch(client, "/api/collections/nope", {"description": "x"})) == (404, "COLLECTION_NOT_FOUND")
    assert error_of(delete(client, "/api/collections/nope?confirm=true")) == (404, "COLLECTION_NOT_FOUND")


def test_creating_an_existing_collection_is_409_collection_exists(client):
    collection_create(name="docs")
    assert error_of(post(client, "/api/collections", {"name": "docs"})) == (409, "COLLECTION_EXISTS")


@pytest.mark.parametrize(
    "body",
    [
        {"name": "has space"},
        {"name": ""},
        {"description": "no name"},
        {"name": "docs", "chunk_max_tokens": 8},
        {"name": "docs", "chunk_min_tokens": 600},
        {"name": "docs", "semantic_weight": 1.5},
        {"name": "docs", "embedding_provider": "nobody"},
        {"name": "docs", "unknown_field": 1},
    ],
)
def test_invalid_settings_are_400_invalid_argument(client, body):
    assert error_of(post(client, "/api/collections", body)) == (400, "INVALID_ARGUMENT")
    assert not Collection.objects.exists()


def test_it_updates_a_collection_s_settings(client):
    collection_create(name="docs", semantic_weight=0.3)
    response = patch(
        client,
        "/api/collections/docs",
        {"description": "New", "chunk_max_tokens": 300, "search_top_k": 5, "search_hybrid": False},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["description"] == "New"
    assert body["settings"]["chunking"]["max_tokens"] == 300
    assert body["settings"]["search"] == {"top_k": 5, "hybrid": False, "semantic_weight": 0.3}


def test_clearing_a_collection_s_semantic_weight_leaves_none(client):
    collection_create(name="docs", semantic_weight=0.3)
    cleared = patch(client, "/api/collections/docs", {"clear_semantic_weight": True}).json()
    assert cleared["settings"]["search"]["semantic_weight"] is None


def test_changing_the_embedding_model_starts_a_background_switch(client, remote_providers):
    collection_create(name="docs")
    body = patch(client, "/api/collections/docs", {"embedding_provider": "ollama"}).json()
    assert body["embedding_model"]["name"] == "all-MiniLM-L6-v2"  # search keeps the old model meanwhile
    assert body["next_embedding_model"]["provider"] == "ollama"
    assert body["next_embedding_model"]["name"] == "nomic-embed-text"
    assert body["reembedding"] == {
        "model": "ollama:nomic-embed-text, 16d",
        "done": 0,
        "total": 0,
        "state": "running",
        "error": "",
    }


def test_a_model_the_provider_cannot_use_is_refused_before_anything_changes(client, settings):
    collection_create(name="docs")
    with fake_ollama(models=("nomic-embed-text",)) as base:
        settings.OLLAMA_HOST = base
        refused = patch(client, "/api/collections/docs", {"embedding_provider": "ollama", "embedding_model": "nope"})
        assert error_of(refused) == (400, "INVALID_ARGUMENT")
        assert "ollama pull nope" in refused.json()["error"]["message"]
        made = post(client, "/api/collections", {"name": "new", "embedding_provider": "ollama", "embedding_model": "x"})
        assert error_of(made) == (400, "INVALID_ARGUMENT")
    settings.OLLAMA_HOST = f"http://127.0.0.1:{free_port()}"
    unreachable = patch(client, "/api/collections/docs", {"embedding_provider": "ollama"})
    assert error_of(unreachable)[1] == "EMBEDDING_ERROR" and "unreachable" in unreachable.json()["error"]["message"]
    local = patch(client, "/api/collections/docs", {"embedding_model": "no-such-local-model"})
    assert error_of(local) == (400, "INVALID_ARGUMENT")
    assert Collection.objects.get(name="docs").next_embedding_model is None
    assert not Collection.objects.filter(name="new").exists()
    # Nor is a row left for a model that was refused (the admin's list of models filled up with them).
    assert not EmbeddingModel.objects.filter(provider="ollama").exists()


def test_a_refused_update_changes_nothing(client):
    collection_create(name="docs")
    for loose in ({"search_hybrid": "no"}, {"search_top_k": "5"}, {"semantic_weight": "0.5"}, {"search_hybrid": 0}):
        assert error_of(patch(client, "/api/collections/docs", loose)) == (400, "INVALID_ARGUMENT"), loose
    response = patch(client, "/api/collections/docs", {"description": "New", "chunk_min_tokens": 600})
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    # The settings are saved, then the model is refused: both or neither.
    response = patch(client, "/api/collections/docs", {"description": "New", "embedding_model": "no-such-model"})
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    collection = Collection.objects.get(name="docs")
    assert collection.description == ""
    assert collection.next_embedding_model is None


def test_deleting_a_collection_needs_confirm_true(client):
    docs = collection_create(name="docs")
    document_create_from_text(collection=docs, source_uri="note://a", text="Alpha text.")
    assert error_of(delete(client, "/api/collections/docs")) == (400, "INVALID_ARGUMENT")
    assert Collection.objects.filter(name="docs").exists()
    response = delete(client, "/api/collections/docs?confirm=true")
    assert response.status_code == 200
    assert response.json() == {"success": True, "name": "docs", "documents": 1, "chunks": 1}
    assert not Collection.objects.filter(name="docs").exists()
    assert not Document.objects.exists()
