"""The admin under input a hostile or careless curator sends by hand: every answer is a page or a
400, never a 500, and nothing is read that the page does not offer."""

import html
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.admin.models import LogEntry
from django.test import AsyncClient
from django.urls import reverse

from kb.admin import common
from kb.models import Collection, Document, IngestRefusal, Source, SyncRun
from kb.services.sources import source_create
from kb.services.tokens import token_create
from tests.support.admin_data import (
    add_text,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    make_collection,
    staff_client,
)

pytestmark = pytest.mark.django_db

TOKENS = reverse("admin:kb_apitoken_changelist")
DOCUMENTS = reverse("admin:kb_document_changelist")
CHUNKS = reverse("admin:kb_chunk_changelist")


def test_a_changelist_filters_only_as_its_page_offers(admin_client):
    """?key_hash__startswith= had told a viewer a token's hash one digit at a time."""
    token, _ = token_create(name="ci")
    viewer = staff_client("viewer", ["view_apitoken"])
    assert viewer.get(TOKENS, {"key_hash__startswith": token.key_hash[:1]}).status_code == 400
    assert viewer.get(TOKENS, {"scope__exact": "read"}).status_code == 200
    collection = make_collection("handbook")
    document = add_text(collection, "note://a")
    for hostile in ({"title__regex": "("}, {"raw_content__icontains": "x"}, {"collection__name__startswith": "h"}):
        assert admin_client.get(DOCUMENTS, hostile).status_code == 400
    offered = admin_client.get(DOCUMENTS, {"collection__id__exact": collection.pk, "status__exact": "pending"})
    assert offered.status_code == 200 and "note://a" in offered.content.decode()
    assert admin_client.get(DOCUMENTS, {"content_type": "text"}).status_code == 200
    assert admin_client.get(CHUNKS, {"document__id__exact": document.pk}).status_code == 200


def test_every_filter_and_sort_link_a_list_offers_answers(admin_client, tmp_path, settings):
    """The error-code filter of "Files not ingested" linked to ?error_code=..., which the list then
    refused with a blank 400: what a list offers, it must take."""
    collection = make_collection("handbook")
    add_text(collection, "note://a")
    IngestRefusal.objects.create(
        collection=collection, source_uri="upload://x.bin", error_code="LOAD_FAILED", error="e"
    )
    IngestRefusal.objects.create(collection=collection, source_uri="upload://y.png", skipped=True, error_code="X")
    token_create(name="ci")
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    source_create(collection=collection, name="docs", folder=str(tmp_path))
    links = 0
    for model in ("document", "chunk", "collection", "apitoken", "ingestrefusal", "source", "syncrun"):
        changelist = reverse(f"admin:kb_{model}_changelist")
        page = admin_client.get(changelist).content.decode()
        for query in set(re.findall(r'href="(\?[^"#]*)"', page)):
            response = admin_client.get(changelist + html.unescape(query))
            assert response.status_code == 200, f"{changelist}{query}: {response.status_code}"
            links += 1
    assert links > 40  # the filters and sort links of seven lists were followed


@pytest.mark.parametrize(
    "url",
    [
        reverse("admin:kb_document_change", args=["\x00"]),
        reverse("admin:kb_document_history", args=["\x00"]),
        reverse("admin:kb_syncrun_change", args=["\x00"]),
        DOCUMENTS + "?status__exact=%00",
        DOCUMENTS + "?q=%00",
        CHUNKS + "?document__id__exact=%00",
        reverse("admin:autocomplete") + "?app_label=kb&model_name=document&field_name=collection&term=%00",
    ],
)
def test_a_nul_character_anywhere_is_a_400(admin_client, url):
    response = admin_client.get(url)
    assert response.status_code == 400 and b"NUL" in response.content


def test_a_nul_character_in_a_form_is_a_400(admin_client):
    collection = make_collection("handbook")
    response = admin_client.post(
        reverse("admin:kb_collection_changelist"), {"action": "delete_selected", "_selected_action": ["\x00"]}
    )
    assert response.status_code == 400 and Collection.objects.filter(pk=collection.pk).exists()


def test_an_action_on_rows_that_cannot_exist_says_so(admin_client):
    collection = make_collection("handbook")
    for changelist, action in ((reverse("admin:kb_collection_changelist"), "delete_selected"), (TOKENS, "revoke")):
        response = admin_client.post(changelist, {"action": action, "_selected_action": ["abc"]}, follow=True)
        assert response.status_code == 200
        assert "The selection names rows that cannot exist." in [str(m) for m in response.context["messages"]]
    assert Collection.objects.filter(pk=collection.pk).exists()


def test_the_chunk_search_takes_any_words(admin_client):
    """Thirty-three dashes had been a 500: Postgres' websearch parser ran out of stack."""
    add_text(make_collection("handbook"), "note://a", text="Wing flutter at transonic speeds.")
    for term in ("-" * 33, "-" * 20_000, '"unbalanced (or) & | ! <->', "flutter " * 5000):
        assert admin_client.get(CHUNKS, {"q": term}, follow=True).status_code == 200
    assert "note://a" in admin_client.get(CHUNKS, {"q": "flutter " + "-" * 33}).content.decode()
    assert "note://a" not in admin_client.get(CHUNKS, {"q": "flutter -wing"}).content.decode()


def test_a_source_that_synced_can_be_deleted_with_its_history(admin_client, tmp_path, settings):
    """Sync runs may not be deleted one by one, which had made Django refuse to delete any source
    (or collection) that had ever synced, even for a superuser."""
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    collection = make_collection("handbook")
    source = source_create(collection=collection, name="manual", folder=str(tmp_path))
    SyncRun.objects.create(source=source, status="succeeded")
    for url in (
        reverse("admin:kb_source_delete", args=[source.pk]),
        reverse("admin:kb_collection_delete", args=[collection.pk]),
    ):
        page = admin_client.get(url).content.decode()
        assert "Are you sure" in page and "permission to delete" not in page
    admin_client.post(reverse("admin:kb_source_delete", args=[source.pk]), {"post": "yes"})
    assert not Source.objects.exists() and not SyncRun.objects.exists()


def test_a_description_past_its_limit_is_a_form_error(admin_client, settings):
    settings.KB_MAX_DESCRIPTION_CHARS = 100
    form = {
        "name": "handbook",
        "description": "d" * 101,
        "embedding_provider": "local",
        "embedding_model_name": "",
        "chunk_max_tokens": 512,
        "chunk_min_tokens": 50,
        "chunk_overlap_tokens": 0,
        "search_top_k": 10,
    }
    response = admin_client.post(reverse("admin:kb_collection_add"), form)
    assert response.status_code == 200 and "KB_MAX_DESCRIPTION_CHARS" in response.content.decode()
    assert not Collection.objects.exists()


def test_the_nul_check_works_in_the_servers_async_chain_too():
    """Under ASGI, through Django's async middleware chain."""
    client = AsyncClient()
    changelist = reverse("admin:kb_collection_changelist")
    assert async_to_sync(client.get)(DOCUMENTS + "?q=%00").status_code == 400
    posted = async_to_sync(client.post)(changelist, {"action": "delete_selected", "_selected_action": ["\x00"]})
    assert posted.status_code == 400 and b"NUL" in posted.content
    assert async_to_sync(client.post)(changelist, {"action": "delete_selected"}).status_code == 302  # to the login


def test_a_search_of_thousands_of_words_is_cut_to_a_few(admin_client):
    """Django matches every word against every search field: 5,000 words held Postgres for 40 s."""
    add_text(make_collection("handbook"), "note://wing")
    response = admin_client.get(DOCUMENTS, {"q": "wing " * 5000, "status__exact": "pending"})
    assert response.status_code == 302
    assert response["Location"] == DOCUMENTS + "?q=" + "+".join(["wing"] * 10) + "&status__exact=pending"
    page = admin_client.get(response["Location"])
    assert "note://wing" in page.content.decode()
    assert [str(m) for m in page.context["messages"]] == [
        "Searched for the first 10 words (200 characters at most) only."
    ]
    assert admin_client.get(DOCUMENTS, {"q": "wing tip"}).status_code == 200


def test_a_page_that_only_shows_a_row_neither_copies_it_nor_logs_a_change(admin_client):
    """Save as new had logged additions of documents that never existed, to anyone allowed to add."""
    document = add_text(make_collection("handbook"), "note://a")
    change = reverse("admin:kb_document_change", args=[document.pk])
    adder = staff_client("adder", ["add_document"])
    assert adder.post(reverse("admin:kb_document_change", args=["NOPE"]), {"_saveasnew": "1"}).status_code == 400
    assert admin_client.post(change, {"_saveasnew": "1"}).status_code == 400
    admin_client.post(change, {"_save": "1"})
    assert not LogEntry.objects.exists()
    assert Document.objects.count() == 1


def test_an_action_on_more_rows_than_a_request_may_take_is_refused(admin_client, monkeypatch):
    """Re-ingesting 9,000 documents in one request had taken 71 s."""
    monkeypatch.setattr(common, "ACTION_MAX_ROWS", 2)
    collection = make_collection("handbook")
    documents = [add_text(collection, f"note://{n}") for n in range(3)]
    everything = {
        "action": "delete_selected",
        "post": "yes",
        "select_across": "1",
        "_selected_action": [documents[0].pk],
    }
    for form in (everything, {**everything, "select_across": "0", "_selected_action": [d.pk for d in documents]}):
        response = admin_client.post(DOCUMENTS, form, follow=True)
        assert [str(m) for m in response.context["messages"]] == [
            "An action takes at most 2 rows at a time: filter the list, then select."
        ]
        assert Document.objects.count() == 3
    two = {**everything, "select_across": "0", "_selected_action": [d.pk for d in documents[:2]]}
    admin_client.post(DOCUMENTS, two)
    assert Document.objects.count() == 1
