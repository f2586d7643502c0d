"""The search playground: every search setting, ranked results with their scores, highlights."""

import pytest
from django.urls import reverse

from kb.services.collections import collection_create
from tests.support.admin_data import (
    add_text,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    make_collection,
    staff_client,
)
from tests.support.fake_providers import fake_ollama
from tests.support.worker import embed_now

pytestmark = pytest.mark.django_db

PLAYGROUND = reverse("admin:kb_playground")

PAGES = {
    "note://lift": ("Lift", "Lift comes from the pressure difference between the upper and lower wing surfaces.\n"),
    "note://drag": ("Drag", "Drag grows with the square of speed; streamlining reduces pressure drag.\n"),
    "note://stall": ("Stall", "Past the critical angle of attack the flow separates and the wing stalls.\n"),
}


@pytest.fixture
def embedded_collection(settings):
    """A collection embedded for real, by the embedding service, against an HTTP fake of Ollama."""
    with fake_ollama() as base:
        settings.OLLAMA_HOST = base
        collection = collection_create(name="aero", embedding_provider="ollama", embedding_model="fake-embed")
        for uri, (title, text) in PAGES.items():
            document = add_text(collection, uri, text, title=title)
            embed_now(document.pk)  # asserts the document was claimed and ended ready
        yield collection


def results_of(response) -> list:
    assert response.status_code == 200
    assert not response.context["form"].errors, response.context["form"].errors
    return [item["result"] for item in response.context["results"]]


def test_the_page_offers_every_search_setting(admin_client):
    make_collection("handbook")
    page = admin_client.get(PLAYGROUND).content.decode()
    for name in ("q", "collections", "mode", "semantic_weight", "top_k", "min_score", "min_similarity", "metadata"):
        assert f'name="{name}"' in page
    assert 'value="handbook"' in page and 'value="hybrid"' in page
    assert admin_client.get(PLAYGROUND).context["response"] is None


def test_a_hybrid_search_shows_every_detail_of_its_results(admin_client, embedded_collection):
    response = admin_client.get(
        PLAYGROUND, {"q": "wing stalls at the critical angle", "collections": "aero", "mode": "hybrid", "top_k": 3}
    )
    results = results_of(response)
    assert results[0].title == "Stall"
    assert results[0].vector_rank is not None and results[0].keyword_rank is not None
    assert results[0].similarity is not None and results[0].score > 0
    page = response.content.decode()
    assert "<mark>stalls</mark>" in page and "<mark>angle</mark>" in page
    assert reverse("admin:kb_document_change", args=[results[0].document_id]) in page
    assert reverse("admin:kb_chunk_change", args=[results[0].chunk_id]) in page
    assert "lines 1\u20131" in page and "Fused (RRF)" in page and "Vector rank" in page and "Keyword rank" in page


def test_the_chosen_mode_reaches_the_search(admin_client, embedded_collection):
    keyword = results_of(admin_client.get(PLAYGROUND, {"q": "pressure", "mode": "keyword", "top_k": 10}))
    assert {result.title for result in keyword} == {"Lift", "Drag"}
    assert all(result.vector_rank is None for result in keyword)


def test_the_chosen_semantic_weight_reaches_the_search(admin_client, embedded_collection):
    response = admin_client.get(PLAYGROUND, {"q": "pressure", "mode": "hybrid", "semantic_weight": "0.2", "top_k": 10})
    assert response.context["response"].semantic_weight == 0.2
    assert "semantic weight 0.20" in response.content.decode()


@pytest.fixture
def turbulence_notes():
    """Four notes that all match "turbulence", of the years 2020 to 2023."""
    collection = make_collection("handbook")
    for n in range(4):
        document = add_text(collection, f"note://{n}", f"Turbulence note number {n}.\n", title=f"Note {n}")
        document.metadata = {**document.metadata, "year": 2020 + n}
        document.save(update_fields=["metadata"])


KEYWORD_TURBULENCE = {"q": "turbulence", "mode": "keyword"}
# "whirlwind" is in no note: each holds a small part of what was asked.
WEAK_QUERY = {"q": "turbulence whirlwind", "mode": "keyword"}


def test_top_k_caps_the_number_of_results(admin_client, turbulence_notes):
    assert len(results_of(admin_client.get(PLAYGROUND, {**KEYWORD_TURBULENCE, "top_k": 2}))) == 2


def test_a_metadata_filter_narrows_the_results(admin_client, turbulence_notes):
    filtered = results_of(
        admin_client.get(PLAYGROUND, {**KEYWORD_TURBULENCE, "top_k": 10, "metadata": '{"year": {"$gte": 2022}}'})
    )
    assert {result.title for result in filtered} == {"Note 2", "Note 3"}


def test_min_score_drops_weak_results(admin_client, turbulence_notes):
    assert len(results_of(admin_client.get(PLAYGROUND, {**WEAK_QUERY, "top_k": 10}))) == 4
    assert results_of(admin_client.get(PLAYGROUND, {**WEAK_QUERY, "top_k": 10, "min_score": "0.5"})) == []
    assert "Nothing matched" in admin_client.get(PLAYGROUND, {**WEAK_QUERY, "min_score": "0.5"}).content.decode()


def test_a_min_score_out_of_range_is_a_form_error(admin_client, turbulence_notes):
    assert (
        "min_score must be between 0.0 and 1.0"
        in admin_client.get(PLAYGROUND, {**KEYWORD_TURBULENCE, "min_score": "100"}).content.decode()
    )


def test_mistakes_are_explained_on_the_form(admin_client):
    make_collection("handbook")
    page = admin_client.get(PLAYGROUND, {"q": "x", "metadata": "{not json"}).content.decode()
    assert "Not valid JSON" in page
    for hostile in ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", '{"a": ' + "9" * 5000 + "}"):  # had been 500s
        response = admin_client.get(PLAYGROUND, {"q": "x", "metadata": hostile})
        assert response.status_code == 200 and "Not valid JSON" in response.content.decode()
    page = admin_client.get(PLAYGROUND, {"q": "x", "metadata": '{"year": {"$near": 1}}'}).content.decode()
    assert "Unknown filter operator" in page and "INVALID_ARGUMENT" in page
    page = admin_client.get(PLAYGROUND, {"q": "x", "collections": "nope"}).content.decode()
    assert "Select a valid choice" in page
    assert "This field is required" in admin_client.get(PLAYGROUND, {"q": ""}).content.decode()


def test_highlighting_escapes_the_chunk_text(admin_client):
    add_text(make_collection("handbook"), "note://html", "Beware <script>alert(1)</script> turbulence.\n")
    page = admin_client.get(PLAYGROUND, {"q": "turbulence", "mode": "keyword"}).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; <mark>turbulence</mark>" in page
    assert "<script>alert(1)" not in page


def test_a_long_chunk_shows_its_beginning_highlighted(admin_client):
    """A page of a hundred 8,192-token chunks, shown whole, had been 11 MB."""
    collection = make_collection("handbook", chunk_max_tokens=8192)
    add_text(
        collection, "note://long", "Turbulence at the start. " + "Calm flow again. " * 2000 + "Turbulence at the end.\n"
    )
    page = admin_client.get(PLAYGROUND, {"q": "turbulence", "mode": "keyword"}).content.decode()
    assert "<mark>Turbulence</mark> at the start." in page and "at the end" not in page
    assert "more characters]" in page and len(page) < 60_000


def test_the_playground_needs_the_chunk_view_permission(db):
    assert staff_client("nobody", []).get(PLAYGROUND).status_code == 403
    assert staff_client("viewer", ["view_chunk"]).get(PLAYGROUND).status_code == 200
