"""The collection pages of the admin: list with counts, create, edit, model switch, delete."""

import pytest
from django.urls import reverse

from kb.models import Chunk, Collection, Document, Embedding
from kb.services.model_switch import collection_reembed_failed, collection_switch_model
from tests.support.admin_data import (
    add_text,
    fail,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    give_vectors,
    make_collection,
    many_documents,
    staff_client,
)
from tests.support.fake_providers import fake_ollama

pytestmark = pytest.mark.django_db

LIST = reverse("admin:kb_collection_changelist")
ADD = reverse("admin:kb_collection_add")


def change_url(collection: Collection) -> str:
    return reverse("admin:kb_collection_change", args=[collection.pk])


def delete_url(collection: Collection) -> str:
    return reverse("admin:kb_collection_delete", args=[collection.pk])


def form_data(**overrides: object) -> dict[str, object]:
    data = {
        "name": "handbook",
        "description": "The staff handbook",
        "embedding_provider": "local",
        "embedding_model_name": "all-MiniLM-L6-v2",
        "chunk_max_tokens": 256,
        "chunk_min_tokens": 20,
        "chunk_overlap_tokens": 10,
        "search_top_k": 7,
        "search_hybrid": "on",
        "semantic_weight": "0.4",
    }
    data.update(overrides)
    return data


def test_the_list_shows_each_collection_s_model_with_its_counts_per_status(admin_client):
    collection = make_collection("handbook")
    ready = add_text(collection, "note://ready")
    give_vectors(ready)
    add_text(collection, "note://pending")
    fail(add_text(collection, "note://broken"), "LOAD_FAILED", "unreadable")
    response = admin_client.get(LIST)
    assert response.status_code == 200
    row = response.context["cl"].result_list[0]
    assert (row.document_total, row.ready_total, row.pending_total, row.failed_total) == (3, 1, 1, 1)
    assert row.chunk_total == Chunk.objects.filter(collection=collection).count()
    html = response.content.decode()
    assert "local:all-MiniLM-L6-v2" in html
    assert f"?collection__id__exact={collection.pk}&amp;status__exact=failed" in html


def test_the_list_costs_the_same_queries_for_many_collections(admin_client, django_assert_max_num_queries):
    for n in range(3):
        many_documents(make_collection(f"c{n}"), 5)
    with django_assert_max_num_queries(8) as few:
        admin_client.get(LIST)
    for n in range(3, 40):
        many_documents(make_collection(f"c{n}"), 5)
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = admin_client.get(LIST)
    assert len(response.context["cl"].result_list) == 40


def test_it_creates_a_collection_through_the_service(admin_client):
    response = admin_client.post(ADD, form_data())
    collection = Collection.objects.get(name="handbook")
    assert response.status_code == 302 and response.url == LIST
    assert (collection.chunk_max_tokens, collection.chunk_min_tokens, collection.chunk_overlap_tokens) == (256, 20, 10)
    assert (collection.search_top_k, collection.search_hybrid, collection.semantic_weight) == (7, True, 0.4)
    assert str(collection.embedding_model) == "local:all-MiniLM-L6-v2, 384d"
    assert collection.description == "The staff handbook"


def test_it_explains_invalid_settings_next_to_the_form(admin_client):
    response = admin_client.post(ADD, form_data(chunk_overlap_tokens=200))
    assert response.status_code == 200
    assert "overlap_tokens must be at least 0 and below half of max_tokens" in response.content.decode()
    response = admin_client.post(ADD, form_data(name="no spaces"))
    assert "letters, digits" in response.content.decode()
    assert not Collection.objects.exists()


def test_a_duplicate_name_is_refused(admin_client):
    make_collection("handbook")
    response = admin_client.post(ADD, form_data())
    assert response.status_code == 200
    assert "already exists" in response.content.decode()


def test_it_edits_a_collection_s_settings(admin_client):
    collection = make_collection("handbook")
    response = admin_client.post(
        change_url(collection), form_data(description="New words", search_top_k=3, semantic_weight="")
    )
    assert response.status_code == 302
    collection.refresh_from_db()
    assert (collection.description, collection.search_top_k) == ("New words", 3)
    assert collection.semantic_weight is None


def test_a_collection_s_name_cannot_be_changed(admin_client):
    collection = make_collection("handbook")
    response = admin_client.post(change_url(collection), form_data(name="renamed", description="New words"))
    assert response.status_code == 302
    collection.refresh_from_db()
    assert (collection.name, collection.description) == ("handbook", "New words")


def test_changing_the_model_starts_a_background_re_embedding(
    admin_client, django_capture_on_commit_callbacks, remote_providers
):
    collection = make_collection("handbook")
    with django_capture_on_commit_callbacks() as callbacks:
        response = admin_client.post(
            change_url(collection),
            form_data(embedding_provider="ollama", embedding_model_name="nomic-embed-text"),
            follow=True,
        )
    collection.refresh_from_db()
    assert str(collection.next_embedding_model) == "ollama:nomic-embed-text, 16d"  # the fake's vectors
    assert str(collection.embedding_model).startswith("local:all-MiniLM-L6-v2")
    assert len(callbacks) == 1  # the re-embedding task, sent on commit
    assert "Re-embedding handbook with ollama:nomic-embed-text" in response.content.decode()
    page = admin_client.get(change_url(collection)).content.decode()
    assert "re-embedding with ollama:nomic-embed-text" in page
    # Choosing the current model again cancels the switch.
    admin_client.post(change_url(collection), form_data())
    collection.refresh_from_db()
    assert collection.next_embedding_model is None


def test_a_model_the_provider_cannot_use_is_a_form_error_that_changes_nothing(admin_client, settings):
    collection = make_collection("handbook")
    with fake_ollama(models=("nomic-embed-text",)) as base:
        settings.OLLAMA_HOST = base
        response = admin_client.post(
            change_url(collection), form_data(embedding_provider="ollama", embedding_model_name="nope")
        )
        assert response.status_code == 200  # the form again, with the error on the model field
        assert "ollama pull nope" in str(response.context["adminform"].form.errors["embedding_model_name"])
        added = admin_client.post(
            reverse("admin:kb_collection_add"),
            form_data(name="fresh", embedding_provider="ollama", embedding_model_name="nope"),
        )
        assert "INVALID_ARGUMENT" in str(added.context["adminform"].form.errors["embedding_model_name"])
    collection.refresh_from_db()
    assert collection.next_embedding_model is None and not Collection.objects.filter(name="fresh").exists()


@pytest.fixture
def stopped_reembedding(remote_providers):
    """A collection whose switch to another model stopped at its first chunk."""
    collection = make_collection("handbook")
    add_text(collection, "note://a")
    collection = collection_switch_model(collection=collection, provider="ollama", model_name="fake-embed")
    collection_reembed_failed(collection_id=collection.pk, reason="Ollama refused the request: gone", stopped=True)
    return collection


def test_a_stopped_re_embedding_says_why_offering_retry_or_cancel(admin_client, stopped_reembedding):
    page = admin_client.get(change_url(stopped_reembedding)).content.decode()
    assert "re-embedding with ollama:fake-embed, 16d stopped</strong> at 0 of 1 chunks: Ollama refused" in page
    assert "Retry re-embedding" in page and "Cancel re-embedding" in page


def test_retrying_a_stopped_re_embedding_queues_it_again(
    admin_client, stopped_reembedding, django_capture_on_commit_callbacks
):
    collection = stopped_reembedding
    with django_capture_on_commit_callbacks() as callbacks:
        admin_client.post(reverse("admin:kb_collection_reembed", args=[collection.pk, "retry"]))
    collection.refresh_from_db()
    assert (collection.reembed_stopped_at, collection.reembed_error, len(callbacks)) == (None, "", 1)


def test_cancelling_a_re_embedding_keeps_the_current_model(admin_client, stopped_reembedding):
    collection = stopped_reembedding
    response = admin_client.post(reverse("admin:kb_collection_reembed", args=[collection.pk, "cancel"]), follow=True)
    assert "Re-embedding cancelled: handbook stays on local:all-MiniLM-L6-v2" in response.content.decode()
    collection.refresh_from_db()
    assert collection.next_embedding_model is None


def test_an_unknown_re_embedding_action_is_forbidden(admin_client, stopped_reembedding):
    url = reverse("admin:kb_collection_reembed", args=[stopped_reembedding.pk, "explode"])
    assert admin_client.post(url).status_code == 403


def test_a_re_embedding_action_needs_a_post(admin_client, stopped_reembedding):
    url = reverse("admin:kb_collection_reembed", args=[stopped_reembedding.pk, "retry"])
    assert admin_client.get(url).status_code == 405


def test_the_delete_page_says_what_the_database_will_remove(admin_client):
    collection = make_collection("handbook")
    documents = [add_text(collection, f"note://{n}") for n in range(2)]
    give_vectors(documents[0])
    chunks = Chunk.objects.filter(collection=collection).count()
    embeddings = Embedding.objects.filter(collection=collection).count()
    page = admin_client.get(delete_url(collection)).content.decode()
    assert "What will be removed" in page
    assert "<strong>2</strong> documents" in page
    assert f"<strong>{chunks}</strong> chunk" in page
    assert f"<strong>{embeddings}</strong> embedding" in page
    response = admin_client.post(delete_url(collection), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not Collection.objects.filter(pk=collection.pk).exists()
    assert not Document.objects.filter(collection_id=collection.pk).exists()
    assert not Chunk.objects.filter(collection_id=collection.pk).exists()
    assert not Embedding.objects.filter(collection_id=collection.pk).exists()
    assert f"Removed 2 documents and {chunks} chunks of handbook" in response.content.decode()


def test_the_bulk_delete_action_confirms_with_counts_then_deletes(admin_client):
    first, second = make_collection("one"), make_collection("two")
    add_text(first, "note://a")
    add_text(second, "note://b")
    selected = {"action": "delete_selected", "_selected_action": [first.pk, second.pk]}
    page = admin_client.post(LIST, selected).content.decode()
    assert "What will be removed" in page and "<strong>2</strong> documents" in page
    admin_client.post(LIST, {**selected, "post": "yes"})
    assert not Collection.objects.exists()
    assert not Document.objects.exists()


def test_a_staff_user_without_delete_permission_cannot_delete(db):
    collection = make_collection("handbook")
    client = staff_client("editor", ["view_collection", "change_collection", "add_collection"])
    assert client.get(LIST).status_code == 200
    assert client.get(delete_url(collection)).status_code == 403
    assert client.post(delete_url(collection), {"post": "yes"}).status_code == 403
    page = client.get(LIST)
    assert "delete_selected" not in page.content.decode()
    client.post(LIST, {"action": "delete_selected", "_selected_action": [collection.pk], "post": "yes"})
    assert Collection.objects.filter(pk=collection.pk).exists()


def test_a_user_who_may_only_view_cannot_change(db):
    collection = make_collection("handbook")
    client = staff_client("reader", ["view_collection"])
    assert client.get(change_url(collection)).status_code == 200
    client.post(change_url(collection), form_data(description="changed"))
    collection.refresh_from_db()
    assert collection.description == ""
    assert client.get(ADD).status_code == 403


def test_embedding_models_are_listed_read_only(admin_client):
    collection = make_collection("handbook")
    page = admin_client.get(reverse("admin:kb_embeddingmodel_changelist")).content.decode()
    assert "all-MiniLM-L6-v2" in page and "384" in page
    assert admin_client.get(reverse("admin:kb_embeddingmodel_add")).status_code == 403
    model_url = reverse("admin:kb_embeddingmodel_delete", args=[collection.embedding_model_id])
    assert admin_client.get(model_url).status_code == 403


def test_the_list_searches_collection_names(admin_client):
    make_collection("handbook")
    make_collection("other")
    response = admin_client.get(LIST, {"q": "hand"})
    assert [c.name for c in response.context["cl"].result_list] == ["handbook"]


def test_a_collection_s_page_links_to_its_documents(admin_client):
    collection = make_collection("handbook")
    page = admin_client.get(change_url(collection)).content.decode()
    assert f"?collection__id__exact={collection.pk}" in page


def test_a_collection_s_page_links_to_its_playground(admin_client):
    collection = make_collection("handbook")
    page = admin_client.get(change_url(collection)).content.decode()
    assert reverse("admin:kb_playground") + "?collections=handbook" in page
