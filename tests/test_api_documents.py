"""REST API: documents (list, get, ingest by URI, upload, re-ingest, re-embed, delete)."""

import base64
import io

import pytest

from kb.errors import ErrorCode, KBError
from kb.models import Document, Embedding, IngestRefusal
from kb.services.collections import collection_create
from kb.services.documents import document_create_from_text
from kb.services.ingest import IngestItem, document_ingest_upload, ingest_refusals_record
from tests.support.api_helpers import delete, error_of, get, post
from tests.support.documents import MARKDOWN, make_pdf, write_mixed_folder
from tests.support.worker import embed_now

pytestmark = pytest.mark.django_db


@pytest.fixture
def docs():
    return collection_create(name="docs")


def data_uri(text: str) -> str:
    return "data:text/plain;base64," + base64.b64encode(text.encode()).decode()


def test_it_ingests_a_data_uri_with_the_fields_given(client, docs):
    response = post(
        client,
        "/api/collections/docs/documents",
        {"uri": data_uri(MARKDOWN), "content_type": "markdown", "metadata": {"author": "Smith"}, "title": "Guide"},
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["collection"], body["created"], body["failed"]) == ("docs", 1, 0)
    (item,) = body["items"]
    assert item["outcome"] == "created"
    assert item["status"] == "pending"
    assert item["chunks"] >= 1
    document = Document.objects.get(pk=item["doc_id"])
    assert (document.title, document.content_type, document.metadata["author"]) == ("Guide", "markdown", "Smith")


def test_the_same_data_uri_ingested_again_is_unchanged(client, docs):
    first = post(client, "/api/collections/docs/documents", {"uri": data_uri(MARKDOWN), "content_type": "markdown"})
    assert first.json()["created"] == 1
    again = post(client, "/api/collections/docs/documents", {"uri": data_uri(MARKDOWN), "content_type": "markdown"})
    assert again.json()["unchanged"] == 1


def test_it_ingests_a_folder_under_the_file_roots_reporting_each_file(client, docs, tmp_path, settings):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    write_mixed_folder(tmp_path / "docs")
    (tmp_path / "docs" / "broken.json").write_text("{not json")
    response = post(client, "/api/collections/docs/documents", {"uri": (tmp_path / "docs").as_uri()})
    assert response.status_code == 200
    body = response.json()
    assert body["created"] == 8
    assert body["failed"] == 1
    (failure,) = [item for item in body["items"] if item["outcome"] == "failed"]
    assert failure["source_uri"].endswith("broken.json")
    assert failure["error"]["code"] == "LOAD_FAILED"


def test_a_folder_ingested_without_recursion_skips_its_subfolders(client, docs, tmp_path, settings):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    write_mixed_folder(tmp_path / "docs")
    (tmp_path / "docs" / "broken.json").write_text("{not json")
    flat = post(client, "/api/collections/docs/documents", {"uri": (tmp_path / "docs").as_uri(), "recursive": False})
    assert len(flat.json()["items"]) == 7  # src/ with its two files is skipped


def test_a_folder_of_more_files_than_a_request_may_read_is_refused_before_any_is_read(client, docs, tmp_path, settings):
    settings.KB_FILE_ROOTS = [str(tmp_path)]
    write_mixed_folder(tmp_path / "docs")  # 8 files, 2 of them in src/
    settings.KB_INGEST_MAX_FILES = 7
    response = post(client, "/api/collections/docs/documents", {"uri": (tmp_path / "docs").as_uri()})
    assert (
        error_of(response) == (400, "INVALID_ARGUMENT") and "KB_INGEST_MAX_FILES" in response.json()["error"]["message"]
    )
    assert not Document.objects.exists()
    flat = post(client, "/api/collections/docs/documents", {"uri": (tmp_path / "docs").as_uri(), "recursive": False})
    assert flat.status_code == 200 and Document.objects.count() == 6


def test_files_outside_the_roots_are_400_invalid_uri(client, docs, tmp_path, settings):
    settings.KB_FILE_ROOTS = []
    (tmp_path / "secret.txt").write_text("secret")
    response = post(client, "/api/collections/docs/documents", {"uri": (tmp_path / "secret.txt").as_uri()})
    assert error_of(response) == (400, "INVALID_URI")
    assert error_of(post(client, "/api/collections/docs/documents", {"uri": "ftp://x/y"})) == (400, "INVALID_URI")


def test_content_that_cannot_be_loaded_is_502_load_failed(client, docs):
    response = post(client, "/api/collections/docs/documents", {"uri": "data:,{not json", "content_type": "json"})
    assert error_of(response) == (502, "LOAD_FAILED")


def test_a_chunk_above_the_token_limit_is_400_text_too_long(client, docs, settings):
    settings.KB_MAX_CHUNK_TOKENS = 16
    response = post(client, "/api/collections/docs/documents", {"uri": data_uri("word " * 200)})
    assert error_of(response) == (400, "TEXT_TOO_LONG")


def test_ingesting_into_an_unknown_collection_is_404(client):
    response = post(client, "/api/collections/nope/documents", {"uri": data_uri("text")})
    assert error_of(response) == (404, "COLLECTION_NOT_FOUND")


def test_it_uploads_several_files_reporting_each(client, docs):
    guide = io.BytesIO(MARKDOWN.encode())
    guide.name = "guide.md"
    paper = io.BytesIO(make_pdf(["Lift and drag of slender wings."], title="Wings"))
    paper.name = "paper.pdf"
    broken = io.BytesIO(b"{not json")
    broken.name = "broken.json"
    response = client.post(
        "/api/collections/docs/uploads", {"files": [guide, paper, broken], "metadata": '{"team": "aero"}'}
    )
    assert response.status_code == 200
    body = response.json()
    assert (body["created"], body["failed"]) == (2, 1)
    assert [item["source_uri"] for item in body["items"]] == [
        "upload://guide.md",
        "upload://paper.pdf",
        "upload://broken.json",
    ]
    assert body["items"][2]["error"]["code"] == "LOAD_FAILED"
    pdf = Document.objects.get(source_uri="upload://paper.pdf")
    assert (pdf.content_type, pdf.metadata["team"]) == ("pdf", "aero")


def test_two_files_of_one_upload_with_one_name_keep_the_first_and_refuse_the_second(client, docs):
    first, second = io.BytesIO(b"Readme of the wing tools."), io.BytesIO(b"Readme of the tail tools.")
    first.name, second.name = "wing/readme.md", "tail/readme.md"  # folders are not part of a name
    body = client.post("/api/collections/docs/uploads", {"files": [first, second]}).json()
    assert [(item["source_uri"], item["outcome"]) for item in body["items"]] == [
        ("upload://readme.md", "created"),
        ("upload://readme.md", "failed"),
    ]
    assert body["items"][1]["error"]["code"] == "INVALID_ARGUMENT"
    stored = Document.objects.get(collection__name="docs", source_uri="upload://readme.md")
    assert stored.raw_content == "Readme of the wing tools."


@pytest.mark.parametrize("name", ["a\x1b[31mb.md", "tab\tname.md", "bell\x07.txt", "c1\x9b.md"])
def test_an_upload_named_with_control_characters_is_refused_or_cleaned(client, docs, name):
    """Django's form parser drops them from a multipart name; the service refuses them from any
    other caller (shown in lists, logs and terminals, an escape sequence would act there)."""
    upload = io.BytesIO(b"Text of the file.")
    upload.name = name
    body = client.post("/api/collections/docs/uploads", {"files": [upload]}).json()
    assert body["items"][0]["source_uri"] == "upload://" + "".join(c for c in name if c.isprintable())
    with pytest.raises(KBError) as raised:
        document_ingest_upload(collection=docs, filename=name, data=b"Text of the file.")
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT and "control characters" in raised.value.message


def test_a_file_named_like_one_that_failed_is_stored(client, docs):
    empty, second = io.BytesIO(b""), io.BytesIO(b"Readme of the tail tools.")
    empty.name, second.name = "wing/readme.md", "tail/readme.md"
    body = client.post("/api/collections/docs/uploads", {"files": [empty, second]}).json()
    assert [item["outcome"] for item in body["items"]] == ["failed", "created"]
    assert Document.objects.get(source_uri="upload://readme.md").raw_content == "Readme of the tail tools."


def test_a_single_upload_that_fails_answers_with_its_error(client, docs):
    broken = io.BytesIO(b"{not json")
    broken.name = "broken.json"
    assert error_of(client.post("/api/collections/docs/uploads", {"files": [broken]})) == (502, "LOAD_FAILED")
    # Recorded where a curator looks, not only answered once.
    refusal = IngestRefusal.objects.get(source_uri="upload://broken.json")
    assert (refusal.collection.name, refusal.skipped, refusal.error_code) == ("docs", False, "LOAD_FAILED")
    assert error_of(client.post("/api/collections/docs/uploads", {})) == (400, "INVALID_ARGUMENT")
    note = io.BytesIO(b"text")
    note.name = "note.txt"
    response = client.post("/api/collections/docs/uploads", {"files": [note], "metadata": "[1, 2]"})
    assert error_of(response) == (400, "INVALID_ARGUMENT")


@pytest.fixture
def five_notes(docs) -> list[str]:
    return [
        document_create_from_text(collection=docs, source_uri=f"note://{n}", text=f"Note {n}.").document.pk
        for n in range(5)
    ]


def test_it_lists_documents_a_page_at_a_time(client, five_notes):
    page = get(client, "/api/collections/docs/documents", limit=2, offset=1).json()
    assert (page["collection"], page["count"], page["limit"], page["offset"]) == ("docs", 2, 2, 1)
    assert [d["id"] for d in page["documents"]] == five_notes[1:3]


def test_it_lists_the_documents_of_one_status(client, five_notes):
    embed_now(five_notes[0])
    ready = get(client, "/api/collections/docs/documents", status="ready").json()
    assert [d["id"] for d in ready["documents"]] == [five_notes[0]]
    assert ready["documents"][0]["embedded_count"] == 1


def test_a_listing_with_bad_arguments_is_refused(client, docs):
    assert error_of(get(client, "/api/collections/docs/documents", limit=1001)) == (400, "INVALID_ARGUMENT")
    assert error_of(get(client, "/api/collections/docs/documents", status="lost")) == (400, "INVALID_ARGUMENT")
    assert error_of(get(client, "/api/collections/nope/documents")) == (404, "COLLECTION_NOT_FOUND")


@pytest.fixture
def guide(docs):
    return document_create_from_text(
        collection=docs, source_uri="note://guide", text=MARKDOWN, content_type="markdown", metadata={"year": 2024}
    ).document


def test_it_gets_a_document_without_its_chunks_or_text_by_default(client, guide):
    plain = get(client, f"/api/documents/{guide.pk}").json()
    assert plain["status"] == "pending"
    assert plain["metadata"]["year"] == 2024
    assert plain["chunks"] is None and plain["content"] is None


def test_it_gets_a_document_s_chunks_with_its_text_on_request(client, guide):
    document = guide
    full = get(client, f"/api/documents/{document.pk}", chunks="true", content="true").json()
    assert full["content"].startswith("# Deployment guide")
    assert [chunk["index"] for chunk in full["chunks"]] == list(range(document.chunk_count))
    assert full["chunks"][0]["lines"] == f"{full['chunks'][0]['line_start']}-{full['chunks'][0]['line_end']}"


def test_a_document_id_is_found_in_any_case_as_ulids_are_case_insensitive(client, guide):
    lower = guide.pk.lower()
    assert get(client, f"/api/documents/{lower}").json()["id"] == guide.pk
    assert delete(client, f"/api/documents/{lower}").json()["deleted_doc_id"] == guide.pk
    assert error_of(get(client, f"/api/documents/{guide.pk}")) == (404, "DOCUMENT_NOT_FOUND")


def test_an_unknown_document_is_404_document_not_found(client, docs):
    missing = "01HRE4KXQN8Z3J2X5Y7A9B4C6D"
    assert error_of(get(client, f"/api/documents/{missing}")) == (404, "DOCUMENT_NOT_FOUND")
    assert error_of(delete(client, f"/api/documents/{missing}")) == (404, "DOCUMENT_NOT_FOUND")
    assert error_of(post(client, f"/api/documents/{missing}/reingest")) == (404, "DOCUMENT_NOT_FOUND")
    assert error_of(post(client, f"/api/documents/{missing}/reembed")) == (404, "DOCUMENT_NOT_FOUND")
    for malformed in ("not-a-ulid", "0" * 25, "0" * 27):  # as over MCP: an id that cannot exist is not found
        assert error_of(get(client, f"/api/documents/{malformed}")) == (404, "DOCUMENT_NOT_FOUND")


def test_reingest_rechunks_with_the_collections_current_settings(client, docs):
    document = document_create_from_text(collection=docs, source_uri="note://long", text="Sentence here. " * 300)
    before = document.document.chunk_count
    docs.chunk_max_tokens, docs.chunk_min_tokens = 64, 0
    docs.save()
    response = post(client, f"/api/documents/{document.document.pk}/reingest")
    assert response.status_code == 200
    body = response.json()
    assert (body["outcome"], body["doc_id"]) == ("updated", document.document.pk)
    assert body["chunks"] > before


def test_reembed_queues_the_document_again_without_its_vectors(client, docs):
    document = document_create_from_text(collection=docs, source_uri="note://a", text="Alpha text.").document
    embed_now(document.pk)
    assert Embedding.objects.filter(chunk__document=document).count() == 1
    response = post(client, f"/api/documents/{document.pk}/reembed")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["embedded_count"]) == ("pending", 0)
    assert not Embedding.objects.filter(chunk__document=document).exists()


def test_it_deletes_a_document(client, docs):
    document = document_create_from_text(collection=docs, source_uri="note://a", text="Alpha text.").document
    response = delete(client, f"/api/documents/{document.pk}")
    assert response.json() == {
        "success": True,
        "deleted_doc_id": document.pk,
        "source_uri": "note://a",
        "collection": "docs",
    }
    assert not Document.objects.exists()


def test_only_the_newest_refusals_are_kept(client, docs, settings):
    settings.KB_REFUSALS_KEPT = 3
    for n in range(5):
        broken = io.BytesIO(b"{not json")
        broken.name = f"broken-{n}.json"
        client.post("/api/collections/docs/uploads", {"files": [broken]})
    kept = list(IngestRefusal.objects.values_list("source_uri", flat=True))
    assert kept == ["upload://broken-4.json", "upload://broken-3.json", "upload://broken-2.json"]


def test_a_file_name_past_the_multipart_header_limit_is_a_json_400(client, docs):
    named = io.BytesIO(b"{not json")
    named.name = "x" * 5000 + ".json"
    response = client.post("/api/collections/docs/uploads", {"files": [named]})
    assert error_of(response) == (400, "INVALID_ARGUMENT")
    assert "could not be read" in response.json()["error"]["message"]


def test_refusals_are_stored_readably_whatever_their_text_holds(docs):
    items = [
        IngestItem(
            source_uri="upload://bad\x00name\udcff.json",
            outcome="failed",
            error=KBError(ErrorCode.LOAD_FAILED, "bad\udcff"),
        ),
        IngestItem(
            source_uri="upload://" + "x" * 5000, outcome="failed", error=KBError(ErrorCode.LOAD_FAILED, "y" * 5000)
        ),
    ]
    ingest_refusals_record(collection=docs, items=items)
    stored = {refusal.source_uri: refusal.error for refusal in IngestRefusal.objects.all()}
    assert stored["upload://bad\ufffdname\ufffd.json"] == "bad\ufffd"
    assert sorted(len(uri) for uri in stored) == [len("upload://bad?name?.json"), 2000]


def test_a_chunk_s_neighbours_are_read_in_document_order_within_the_token_s_collections(client):
    from kb.services.tokens import token_create

    manual = collection_create(name="manual", chunk_max_tokens=24, chunk_min_tokens=0)
    collection_create(name="secret")
    text = "# Glider manual\n\n" + "\n\n".join(
        f"## {name}\n\nThe {name.lower()} steps of the glider come in this order."
        for name in ("Rigging", "Launch", "Thermals", "Landing")
    )
    document = document_create_from_text(
        collection=manual, source_uri="file:///manual.md", text=text, content_type="markdown"
    ).document
    _, reader = token_create(name="manual reader", scope="read", collections=["manual"])

    response = get(client, f"/api/documents/{document.pk}/chunks/2/neighbors", reader, before=2, after=5)
    assert response.status_code == 200
    body = response.json()
    assert (body["document_id"], body["collection"], body["source_uri"]) == (document.pk, "manual", "file:///manual.md")
    indices = [chunk["index"] for chunk in body["chunks"]]
    assert indices == list(range(document.chunk_count)) and len(indices) > 3
    assert body["chunks"][0]["heading_path"] == ["Glider manual"]
    assert body["chunks"][-1]["heading_path"] == ["Glider manual", "Landing"]

    hidden = document_create_from_text(collection=collection_create(name="other"), source_uri="x://y", text="z")
    refused = get(client, f"/api/documents/{hidden.document.pk}/chunks/0/neighbors", reader)
    assert error_of(refused) == (404, "DOCUMENT_NOT_FOUND")
    for path, params in (("99", {}), ("-1", {}), ("x", {}), ("0", {"before": 11}), ("0", {"after": "many"})):
        refused = get(client, f"/api/documents/{document.pk}/chunks/{path}/neighbors", **params)
        assert error_of(refused) == (400, "INVALID_ARGUMENT"), (path, params)
