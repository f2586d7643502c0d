"""The document pages of the admin: list, filters, adding, actions, detail page, live status."""

import base64
import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from kb.errors import ErrorCode
from kb.models import Chunk, Document, DocumentStatus, Embedding, IngestRefusal
from tests.support.admin_data import (
    WINGS,
    add_text,
    fail,
    fast_password_hashing,  # noqa: F401 - an autouse fixture
    give_vectors,
    make_collection,
    many_documents,
    staff_client,
)
from tests.support.http_server import serve, text

pytestmark = pytest.mark.django_db

LIST = reverse("admin:kb_document_changelist")
ADD = reverse("admin:kb_document_add")
STATUS = reverse("admin:kb_document_status")


def change_url(document: Document) -> str:
    return reverse("admin:kb_document_change", args=[document.pk])


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def act(client, action: str, *documents: Document, **extra):
    return client.post(
        LIST, {"action": action, "_selected_action": [doc.pk for doc in documents], **extra}, follow=True
    )


# --- the list ---------------------------------------------------------------------------------


@pytest.fixture
def ready_beside_failed():
    collection = make_collection("handbook")
    ready = add_text(collection, "note://wings", title="Wings")
    give_vectors(ready)
    broken = fail(add_text(collection, "note://broken", title="Broken"), ErrorCode.LOAD_FAILED, "unreadable")
    return ready, broken


def test_the_list_shows_each_document_s_status_badge_with_its_details(admin_client, ready_beside_failed):
    ready, broken = ready_beside_failed
    page = admin_client.get(LIST).content.decode()
    assert f'data-kb-doc="{ready.pk}" data-kb-status="ready">Ready</span>' in page
    assert f'data-kb-doc="{broken.pk}" data-kb-status="failed" title="LOAD_FAILED: unreadable">Failed</span>' in page
    assert f'data-kb-progress="{ready.pk}"' in page and f"{ready.chunk_count} / {ready.chunk_count}" in page
    assert "handbook" in page and "markdown" in page and "note://wings" in page


def test_the_list_loads_the_live_status_script(admin_client, ready_beside_failed):
    page = admin_client.get(LIST).content.decode()
    assert "kb/status.js" in page and f'data-kb-status-url="{STATUS}"' in page


def test_the_list_stays_cheap_however_many_documents_there_are(admin_client, django_assert_max_num_queries):
    collection = make_collection("handbook")
    many_documents(collection, 3)
    with django_assert_max_num_queries(12) as few:
        admin_client.get(LIST)
    many_documents(make_collection("more"), 300)
    with django_assert_max_num_queries(len(few.captured_queries)) as many:
        response = admin_client.get(LIST)
    assert len(response.context["cl"].result_list) == 100  # one page
    document_queries = [q["sql"] for q in many.captured_queries if 'FROM "kb_document"' in q["sql"]]
    assert document_queries and not any("raw_content" in sql for sql in document_queries)
    # The filtered count only: no second COUNT(*) over every document for "N total".
    assert sum("COUNT(*)" in sql for sql in document_queries) == 1


@pytest.fixture
def two_collections():
    """Nine documents in "handbook", three in "other"."""
    handbook, other = make_collection("handbook"), make_collection("other")
    many_documents(handbook, 9)
    many_documents(other, 3)
    return handbook, other


def listed_titles(client, query: str) -> set[str]:
    return {doc.title for doc in client.get(LIST + query).context["cl"].result_list}


def test_the_list_filters_by_collection(admin_client, two_collections):
    handbook, _ = two_collections
    assert len(listed_titles(admin_client, f"?collection__id__exact={handbook.pk}")) == 9


def test_the_list_filters_by_status(admin_client, two_collections):
    _, other = two_collections
    assert listed_titles(admin_client, f"?collection__id__exact={other.pk}&status__exact=failed") == {"Bulk document 2"}


def test_the_list_filters_by_content_type(admin_client, two_collections):
    _, other = two_collections
    query = "?content_type=python&collection__id__exact=" + str(other.pk)
    assert listed_titles(admin_client, query) == {"Bulk document 1"}


def test_the_list_searches_titles(admin_client, two_collections):
    assert listed_titles(admin_client, "?q=document+7") == {"Bulk document 7"}


def test_the_list_searches_sources(admin_client, two_collections):
    assert len(listed_titles(admin_client, "?q=bulk://other/")) == 3


# --- adding documents -------------------------------------------------------------------------


def test_it_uploads_several_files_at_once_into_a_collection(admin_client):
    collection = make_collection("handbook")
    files = [
        SimpleUploadedFile("wings.md", WINGS.encode()),
        SimpleUploadedFile("retry.py", b"def retry(attempts):\n    return attempts * 2\n"),
        SimpleUploadedFile("notes.txt", b"Plain notes about turbulence and drag.\n"),
    ]
    response = admin_client.post(
        ADD,
        {
            "form": "upload",
            "upload-collection": collection.pk,
            "upload-files": files,
            "upload-metadata": '{"team": "a"}',
        },
        follow=True,
    )
    assert response.redirect_chain[-1][0] == f"{LIST}?collection__id__exact={collection.pk}"
    documents = Document.objects.filter(collection=collection)
    assert {doc.source_uri for doc in documents} == {"upload://wings.md", "upload://retry.py", "upload://notes.txt"}
    assert {doc.content_type for doc in documents} == {"markdown", "python", "plain_text"}
    assert all(doc.status == DocumentStatus.PENDING and doc.metadata["team"] == "a" for doc in documents)
    assert sorted(messages_of(response)) == ["Created: notes.txt", "Created: retry.py", "Created: wings.md"]


def upload(client, collection, *files):
    return client.post(ADD, {"form": "upload", "upload-collection": collection.pk, "upload-files": files}, follow=True)


def test_a_bad_file_is_reported_by_name_without_stopping_the_others(admin_client):
    collection = make_collection("handbook")
    response = upload(
        admin_client,
        collection,
        SimpleUploadedFile("empty.txt", b"   \n"),
        SimpleUploadedFile("good.txt", b"Some real text.\n"),
        SimpleUploadedFile("zero.txt", b""),  # no bytes at all: the same, not a form error for the batch
    )
    notes = messages_of(response)
    assert "Created: good.txt" in notes
    for name in ("empty.txt", "zero.txt"):
        assert any(
            note.startswith(f"Not ingested: {name}: No text to index") and "LOAD_FAILED" in note for note in notes
        )
    assert list(Document.objects.values_list("source_uri", flat=True)) == ["upload://good.txt"]


def test_a_refused_upload_stays_listed_on_the_dashboard_with_its_reason(admin_client):
    """Not only flashed once: the dashboard lists it, with its reason."""
    collection = make_collection("handbook")
    upload(
        admin_client,
        collection,
        SimpleUploadedFile("empty.txt", b"   \n"),
        SimpleUploadedFile("good.txt", b"Some real text.\n"),
    )
    dashboard = admin_client.get("/admin/").content.decode()
    assert "upload://empty.txt" in dashboard and "LOAD_FAILED" in dashboard and "No text to index" in dashboard


def test_a_lone_bad_file_is_recorded_as_refused(admin_client):
    collection = make_collection("handbook")
    alone = admin_client.post(
        ADD,
        {"form": "upload", "upload-collection": collection.pk, "upload-files": [SimpleUploadedFile("e.txt", b" ")]},
        follow=True,
    )
    assert any(note.startswith("Not ingested: e.txt: No text to index") for note in messages_of(alone))
    assert IngestRefusal.objects.filter(source_uri="upload://e.txt", collection=collection).exists()


def test_the_upload_form_explains_what_is_missing(admin_client):
    make_collection("handbook")
    response = admin_client.post(ADD, {"form": "upload", "upload-metadata": "[1, 2]"})
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count("This field is required.") == 2
    assert "Use a JSON object" in page


def test_it_adds_a_data_uri(admin_client):
    collection = make_collection("handbook")
    payload = base64.b64encode(b"# Boundary layers\n\nThey separate at high angles.\n").decode()
    response = admin_client.post(
        ADD,
        {
            "form": "source",
            "source-collection": collection.pk,
            "source-uri": f"data:text/markdown;base64,{payload}",
            "source-title": "Boundary layers",
        },
        follow=True,
    )
    document = Document.objects.get(collection=collection)
    assert document.title == "Boundary layers" and document.content_type == "markdown"
    assert "Ingested 1 source(s): 1 created." in messages_of(response)


def test_urls_follow_the_same_rules_as_everywhere_else(admin_client, settings, tmp_path):
    collection = make_collection("handbook")
    with serve({"/page": text("secret intranet page")}) as base:
        response = admin_client.post(
            ADD, {"form": "source", "source-collection": collection.pk, "source-uri": f"{base}/page"}
        )
    assert response.status_code == 200  # the form again, with the error as a message
    assert any("INVALID_URI" in note and "127.0.0.1" in note for note in messages_of(response))
    settings.KB_FILE_ROOTS = [str(tmp_path / "allowed")]
    (tmp_path / "allowed").mkdir()
    (tmp_path / "secret.txt").write_text("outside the roots")
    response = admin_client.post(
        ADD, {"form": "source", "source-collection": collection.pk, "source-uri": f"file://{tmp_path}/secret.txt"}
    )
    assert any("outside" in note.lower() or "INVALID_URI" in note for note in messages_of(response))
    assert not Document.objects.exists()


def test_a_folder_inside_the_file_roots_is_ingested_file_by_file(admin_client, settings, tmp_path):
    collection = make_collection("handbook")
    (tmp_path / "a.md").write_text(WINGS)
    (tmp_path / "b.txt").write_text("Second file.\n")
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    response = admin_client.post(
        ADD, {"form": "source", "source-collection": collection.pk, "source-uri": f"file://{tmp_path}"}, follow=True
    )
    assert "Ingested 2 source(s): 2 created." in messages_of(response)
    assert Document.objects.filter(collection=collection).count() == 2


def test_the_add_button_keeps_the_collection_the_list_is_filtered_by(admin_client):
    collection = make_collection("handbook")
    page = admin_client.get(f"{LIST}?collection__id__exact={collection.pk}").content.decode()
    assert f'href="{ADD}?collection={collection.pk}"' in page
    form = admin_client.get(f"{ADD}?collection={collection.pk}").context["upload_form"]
    assert str(form.initial["collection"]) == str(collection.pk)


# --- actions ----------------------------------------------------------------------------------


def test_retry_failed_queues_only_failed_documents(admin_client, django_capture_on_commit_callbacks):
    collection = make_collection("handbook")
    broken = fail(add_text(collection, "note://broken"), ErrorCode.EMBEDDING_ERROR, "Ollama is unreachable")
    ready = add_text(collection, "note://ready")
    give_vectors(ready)
    with django_capture_on_commit_callbacks() as callbacks:
        response = act(admin_client, "retry_failed", broken, ready)
    broken.refresh_from_db()
    ready.refresh_from_db()
    assert (broken.status, broken.error) == (DocumentStatus.PENDING, "")
    assert ready.status == DocumentStatus.READY
    assert len(callbacks) == 1
    assert "Queued 1 document for embedding again." in messages_of(response)
    response = act(admin_client, "retry_failed", ready)
    assert "None of the selected documents has failed." in messages_of(response)


def test_re_embed_queues_the_document_again_without_its_vectors(admin_client):
    document = add_text(make_collection("handbook"), "note://wings")
    give_vectors(document)
    response = act(admin_client, "reembed", document)
    document.refresh_from_db()
    assert document.status == DocumentStatus.PENDING and document.embedded_count == 0
    assert not Embedding.objects.filter(chunk__document=document).exists()
    assert "Queued 1 document for re-embedding." in messages_of(response)


def test_re_ingest_rechunks_with_the_collections_current_settings(admin_client):
    collection = make_collection("handbook")
    long_text = "\n\n".join(f"Paragraph {n} about lift, drag and the boundary layer." * 4 for n in range(30))
    document = add_text(collection, "note://long", long_text)
    before = document.chunk_count
    collection.chunk_max_tokens, collection.chunk_min_tokens = 32, 0
    collection.save()
    response = act(admin_client, "reingest", document)
    document.refresh_from_db()
    assert document.chunk_count > before
    assert "Re-ingested 1 document; their chunks are being embedded." in messages_of(response)


def test_re_ingest_reports_a_source_that_cannot_be_read_again(admin_client, settings, tmp_path):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    (tmp_path / "gone.md").write_text(WINGS)
    collection = make_collection("handbook")
    admin_client.post(
        ADD, {"form": "source", "source-collection": collection.pk, "source-uri": f"file://{tmp_path}/gone.md"}
    )
    document = Document.objects.get()
    (tmp_path / "gone.md").unlink()
    response = act(admin_client, "reingest", document)
    assert any(note.startswith("Failed for “Wings”: No such file") for note in messages_of(response))


def test_deleting_documents_removes_their_chunks_after_a_confirmation_with_counts(admin_client):
    collection = make_collection("handbook")
    first, second = add_text(collection, "note://a"), add_text(collection, "note://b")
    give_vectors(first)
    page = act(admin_client, "delete_selected", first, second).content.decode()
    chunks = first.chunk_count + second.chunk_count
    assert "What will be removed" in page and f"<strong>{chunks}</strong> chunk" in page
    act(admin_client, "delete_selected", first, second, post="yes")
    assert not Document.objects.exists() and not Chunk.objects.exists() and not Embedding.objects.exists()


def test_the_delete_page_of_one_document_shows_its_chunks(admin_client):
    document = add_text(make_collection("handbook"), "note://a")
    url = reverse("admin:kb_document_delete", args=[document.pk])
    assert f"<strong>{document.chunk_count}</strong> chunk" in admin_client.get(url).content.decode()
    admin_client.post(url, {"post": "yes"})
    assert not Document.objects.exists() and not Chunk.objects.exists()


def test_staff_without_delete_or_change_permission_cannot_run_those_actions(db):
    document = fail(add_text(make_collection("handbook"), "note://a"), ErrorCode.LOAD_FAILED, "x")
    client = staff_client("viewer", ["view_document", "view_collection"])
    page = client.get(LIST).content.decode()
    for action in ("delete_selected", "retry_failed", "reingest", "reembed"):
        assert f'value="{action}"' not in page
    act(client, "delete_selected", document, post="yes")
    act(client, "retry_failed", document)
    assert client.get(reverse("admin:kb_document_delete", args=[document.pk])).status_code == 403
    assert client.post(reverse("admin:kb_document_run", args=[document.pk, "retry_failed"])).status_code == 403
    assert client.get(ADD).status_code == 403
    document.refresh_from_db()
    assert document.status == DocumentStatus.FAILED


# --- the detail page --------------------------------------------------------------------------


def test_the_detail_page_explains_a_failure_in_plain_words(admin_client):
    document = fail(
        add_text(make_collection("handbook"), "note://a"), ErrorCode.EMBEDDING_ERROR, "Ollama at x is unreachable"
    )
    page = admin_client.get(change_url(document)).content.decode()
    assert "The embedding provider failed; check that it is running, then retry." in page
    assert "Ollama at x is unreachable" in page
    assert reverse("admin:kb_document_run", args=[document.pk, "retry_failed"]) in page


LONG_TEXT = "\n\n".join(f"Paragraph {n}: the lift coefficient grows with the angle of attack." for n in range(120))


@pytest.fixture
def long_document(admin_client):
    """A long embedded document with an author, and its detail page."""
    collection = make_collection("handbook", chunk_max_tokens=64, chunk_min_tokens=0)
    document = add_text(collection, "note://long", LONG_TEXT, title="Lift")
    give_vectors(document)
    Document.objects.filter(pk=document.pk).update(metadata={**document.metadata, "author": "Smith"})
    return document, admin_client.get(change_url(document)).content.decode()


def test_the_detail_page_shows_the_metadata(long_document):
    document, page = long_document
    assert '<th scope="row">author</th><td>Smith</td>' in page
    ingested = document.metadata["ingestion_date"]
    assert re.search(rf'<th scope="row">ingestion_date</th><td>\w+\.? \d+, 20\d\d, [^<]+ \({ingested}\)</td>', page)


def test_the_detail_page_previews_only_the_start_of_the_text(long_document):
    _, page = long_document
    assert "Paragraph 0: the lift" in page and "Paragraph 119" not in page.split("kb-preview")[1].split("</pre>")[0]
    assert f"The first 3,000 of {len(LONG_TEXT):,} characters." in page


def test_the_detail_page_lists_the_chunks_without_their_vectors(long_document):
    document, page = long_document
    assert page.count('<span class="kb-yes">yes</span>') == document.chunk_count
    assert "0.1," not in page and "vector" not in page.lower().replace("search_vector", "")


def test_the_detail_page_offers_nothing_to_edit_by_hand(long_document):
    _, page = long_document
    assert 'name="_save"' not in page


def test_the_detail_page_marks_chunks_without_a_vector(admin_client):
    document = add_text(make_collection("handbook"), "note://a")
    page = admin_client.get(change_url(document)).content.decode()
    assert page.count('<span class="kb-no">not yet</span>') == document.chunk_count
    assert f"?document__id__exact={document.pk}" in page


def test_the_detail_page_buttons_run_the_same_actions(admin_client):
    document = fail(add_text(make_collection("handbook"), "note://a"), ErrorCode.DATABASE_ERROR, "boom")
    response = admin_client.post(reverse("admin:kb_document_run", args=[document.pk, "retry_failed"]), follow=True)
    assert response.redirect_chain[-1][0] == change_url(document)
    document.refresh_from_db()
    assert document.status == DocumentStatus.PENDING
    assert admin_client.post(reverse("admin:kb_document_run", args=[document.pk, "nonsense"])).status_code == 403


# --- live status ------------------------------------------------------------------------------


@pytest.fixture
def processing_beside_ready():
    collection = make_collection("handbook")
    pending = add_text(collection, "note://pending")
    ready = add_text(collection, "note://ready")
    give_vectors(ready)
    Document.objects.filter(pk=pending.pk).update(status=DocumentStatus.PROCESSING, embedded_count=1)
    return pending, ready


def test_the_status_endpoint_reports_each_document_s_progress(admin_client, processing_beside_ready):
    pending, ready = processing_beside_ready
    response = admin_client.get(STATUS, {"id": [pending.pk, ready.pk, "01NOTADOCUMENT000000000000"]})
    data = json.loads(response.content)
    by_id = {doc["id"]: doc for doc in data["documents"]}
    assert set(by_id) == {pending.pk, ready.pk}
    assert by_id[pending.pk] | {"error": ""} == {
        "id": pending.pk,
        "status": "processing",
        "label": "Processing",
        "error_code": "",
        "error": "",
        "chunk_count": pending.chunk_count,
        "embedded_count": 1,
    }
    assert by_id[ready.pk]["status"] == "ready"


def test_the_status_endpoint_reports_the_queue(admin_client, processing_beside_ready):
    pending, ready = processing_beside_ready
    data = json.loads(admin_client.get(STATUS, {"id": [pending.pk, ready.pk]}).content)
    assert data["queue"] == {"pending": 0, "processing": 1, "failed": 0}


def test_the_status_endpoint_needs_the_view_permission(db, client):
    assert client.get(STATUS).status_code == 302  # to the login page
    assert staff_client("nobody", []).get(STATUS).status_code == 403
    assert staff_client("viewer", ["view_document"]).get(STATUS).status_code == 200
