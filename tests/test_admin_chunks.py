"""The chunk pages of the admin: read-only, searchable through the full-text index."""

import pytest
from django.urls import reverse

from kb.models import Chunk
from tests.support.admin_data import (
    add_text,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    make_collection,
    many_documents,
    staff_client,
)

pytestmark = pytest.mark.django_db

LIST = reverse("admin:kb_chunk_changelist")


def test_each_listed_chunk_shows_its_document_lines_with_a_preview(admin_client):
    document = add_text(make_collection("handbook"), "note://wings", title="Wings")
    chunk = Chunk.objects.filter(document=document).order_by("index").first()
    page = admin_client.get(LIST).content.decode()
    assert reverse("admin:kb_document_change", args=[document.pk]) in page
    assert f"{chunk.line_start}-{chunk.line_end}" in page
    assert "Lift comes from pressure" in page


def test_the_list_stays_cheap_however_many_chunks_there_are(admin_client, django_assert_max_num_queries):
    many_documents(make_collection("small"), 2, chunks_each=3)
    with django_assert_max_num_queries(10) as few:
        admin_client.get(LIST)
    many_documents(make_collection("large"), 50, chunks_each=40)
    with django_assert_max_num_queries(len(few.captured_queries)) as many:
        response = admin_client.get(LIST)
    assert len(response.context["cl"].result_list) == 100
    rows = next(q["sql"] for q in many.captured_queries if 'FROM "kb_chunk"' in q["sql"] and "LIMIT 100" in q["sql"])
    assert "search_vector" not in rows and '"kb_document"."raw_content"' not in rows
    # The text is read only as LEFT(content, 160).
    assert rows.count('"kb_chunk"."content"') == rows.count('LEFT("kb_chunk"."content", 160)') >= 1


def test_search_uses_the_stemmed_full_text_index(admin_client):
    collection = make_collection("handbook")
    add_text(collection, "note://a", "Turbulent flows mix momentum quickly.\n", title="Flows")
    add_text(collection, "note://b", "Laminar layers stay smooth.\n", title="Layers")
    response = admin_client.get(LIST, {"q": "turbulence"})
    assert [str(chunk.document) for chunk in response.context["cl"].result_list] == ["Flows"]
    response = admin_client.get(LIST, {"q": "smooth -laminar"})
    assert list(response.context["cl"].result_list) == []


def test_the_list_filters_by_collection(admin_client):
    first, second = make_collection("one"), make_collection("two")
    add_text(first, "note://a")
    add_text(second, "note://b")
    by_collection = admin_client.get(LIST, {"collection__id__exact": second.pk}).context["cl"].result_list
    assert {chunk.collection_id for chunk in by_collection} == {second.pk}


def test_the_list_filters_by_document(admin_client):
    first, second = make_collection("one"), make_collection("two")
    document = add_text(first, "note://a")
    add_text(second, "note://b")
    by_document = admin_client.get(LIST, {"document__id__exact": document.pk}).context["cl"].result_list
    assert {chunk.document_id for chunk in by_document} == {document.pk}


def test_a_chunk_is_read_only_even_for_a_superuser(admin_client):
    document = add_text(make_collection("handbook"), "note://a")
    chunk = Chunk.objects.filter(document=document).first()
    url = reverse("admin:kb_chunk_change", args=[chunk.pk])
    page = admin_client.get(url).content.decode()
    assert "Lift comes from pressure" in page and 'name="_save"' not in page
    assert "Heading path" in page
    admin_client.post(url, {"content": "changed"})
    chunk.refresh_from_db()
    assert chunk.content.startswith("# Wings") or "Lift" in chunk.content
    assert admin_client.get(reverse("admin:kb_chunk_add")).status_code == 403
    assert admin_client.get(reverse("admin:kb_chunk_delete", args=[chunk.pk])).status_code == 403


def test_chunks_need_the_view_permission(db):
    assert staff_client("nobody", []).get(LIST).status_code == 403
    assert staff_client("viewer", ["view_chunk"]).get(LIST).status_code == 200
