"""document_ingest from folders, files, data: URIs and uploads: formats, chunks, updates."""

import base64
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection

from kb.errors import ErrorCode, KBError
from kb.ingestion.sources import confine, load_file
from kb.models import Chunk, Document, DocumentStatus, Embedding
from kb.services.collections import collection_create
from kb.services.ingest import ChunkInput, document_ingest, document_ingest_upload, document_store_chunks
from tests.support.documents import MARKDOWN, PYTHON, make_pdf, write_mixed_folder


@pytest.fixture
def collection(db):
    return collection_create(name="docs")


def ingest(collection, uri, roots, **options):
    return document_ingest(collection=collection, uri=str(uri), file_roots=[Path(r) for r in roots], **options)


def embed_everything(collection) -> None:
    """Vectors for every chunk, as the worker would store them (the worker itself is tested elsewhere)."""
    model = collection.embedding_model
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO kb_embedding (chunk_id, model_id, collection_id, vector, created_at) "
            "SELECT c.id, %s, c.collection_id, array_fill(0.1, ARRAY[%s])::vector, now() FROM kb_chunk c "
            "WHERE c.collection_id = %s ON CONFLICT DO NOTHING",
            [model.pk, model.dimensions, collection.pk],
        )


def test_a_folder_of_mixed_files_becomes_one_document_per_file(collection, tmp_path):
    types = write_mixed_folder(tmp_path / "docs")
    report = ingest(collection, (tmp_path / "docs").as_uri(), [tmp_path])
    assert report.failed == []
    assert report.count("created") == len(types)
    by_name = {Path(doc.source_uri).name: doc for doc in Document.objects.all()}
    assert {name: doc.content_type for name, doc in by_name.items()} == {Path(n).name: t for n, t in types.items()}
    for document in by_name.values():
        assert document.status == DocumentStatus.PENDING
        chunks = list(document.chunks.order_by("index"))
        assert chunks and document.chunk_count == len(chunks)
        lines = document.raw_content.split("\n")
        for chunk in chunks:
            # A chunk's line range points at the lines of the stored text that hold it.
            span = "\n".join(lines[chunk.line_start - 1 : chunk.line_end])
            assert chunk.content.strip() in span
            assert chunk.token_count > 0
    pdf = by_name["paper.pdf"]
    assert pdf.metadata["page_count"] == 2 and pdf.metadata["author"] == "Smith" and pdf.title == "Wings"
    assert {chunk.page for chunk in pdf.chunks.all()} == {1, 2}
    assert by_name["report.docx"].metadata["author"] == "Lee"
    assert "Privacy policy" not in by_name["notes.html"].raw_content  # main content, not the footer
    assert by_name["guide.md"].metadata["file_size"] == len(MARKDOWN.encode())


def test_running_it_again_changes_nothing(collection, tmp_path):
    write_mixed_folder(tmp_path / "docs")
    ingest(collection, tmp_path / "docs", [tmp_path])
    before = dict(Chunk.objects.values_list("id", "content_hash"))
    again = ingest(collection, tmp_path / "docs", [tmp_path])
    assert again.count("unchanged") == len(again.items) and again.failed == []
    assert dict(Chunk.objects.values_list("id", "content_hash")) == before


@pytest.fixture
def edited_manual(db, tmp_path):
    """A manual of four sections ingested and embedded, then ingested again with one section rewritten;
    returns the first document and the item of the second ingest."""
    collection = collection_create(name="small", chunk_max_tokens=200, chunk_min_tokens=0)
    folder = tmp_path / "docs"
    folder.mkdir()
    sections = [f"## Section {n}\n\n" + f"Paragraph {n} explains topic {n} in detail. " * 15 for n in range(4)]
    (folder / "long.md").write_text("# Manual\n\n" + "\n\n".join(sections))
    first = ingest(collection, folder / "long.md", [tmp_path]).items[0].document
    assert first.chunk_count >= 3
    embed_everything(collection)
    sections[2] = "## Section 2\n\nThis section was rewritten entirely."
    (folder / "long.md").write_text("# Manual\n\n" + "\n\n".join(sections))
    return first, ingest(collection, folder / "long.md", [tmp_path]).items[0]


def test_editing_a_file_updates_its_document_in_place(edited_manual):
    first, item = edited_manual
    assert item.outcome == "updated" and item.document.pk == first.pk
    assert Document.objects.count() == 1


def test_editing_a_file_reuses_the_vectors_of_its_unchanged_chunks(edited_manual):
    _, item = edited_manual
    document = Document.objects.get()
    missing = Chunk.objects.filter(document=document).exclude(embeddings__isnull=False)
    assert item.chunks_reused == document.chunk_count - missing.count() >= 2
    assert [chunk.content for chunk in missing] == [
        c.content for c in document.chunks.all() if "rewritten" in c.content
    ]
    assert document.embedded_count == item.chunks_reused
    assert document.status == DocumentStatus.PENDING  # only the changed chunk waits for the worker


def test_a_single_file_can_be_given_as_a_bare_path_with_a_content_type_override(collection, tmp_path):
    (tmp_path / "snippet.txt").write_text(PYTHON)
    item = ingest(collection, str(tmp_path / "snippet.txt"), [tmp_path], content_type="python").items[0]
    assert item.document.content_type == "python"
    assert item.document.source_uri == (tmp_path / "snippet.txt").as_uri()


def test_an_unknown_content_type_is_an_invalid_argument(collection, tmp_path):
    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(KBError) as error:
        ingest(collection, tmp_path / "a.txt", [tmp_path], content_type="cobol")
    assert error.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "uri",
    [
        'data:,fn main() { println!("Hello"); }',
        "data:text/plain;charset=utf-8," + quote('fn main() { println!("Hello"); }'),
        "data:text/plain;base64," + base64.b64encode(b'fn main() { println!("Hello"); }').decode(),
    ],
)
def test_data_uris_are_decoded(collection, uri):
    document = ingest(collection, uri, [], content_type="rust").items[0].document
    assert document.raw_content == 'fn main() { println!("Hello"); }'
    assert document.content_type == "rust"
    assert document.source_uri.startswith("data:sha256,")
    assert ingest(collection, uri, [], content_type="rust").items[0].outcome == "unchanged"


@pytest.mark.parametrize(
    ("uri", "code"),
    [
        ("data:text/plain;base64,not base64!", ErrorCode.INVALID_URI),
        ("data:no-comma-here", ErrorCode.INVALID_URI),
        ("gopher://example.org/file", ErrorCode.INVALID_URI),
        ("file://[::1/tmp/a.md", ErrorCode.INVALID_URI),  # urlsplit's ValueError
        ("", ErrorCode.INVALID_URI),
        (
            "data:application/octet-stream;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode(),
            ErrorCode.LOAD_FAILED,
        ),
    ],
)
def test_a_bad_uri_is_refused_without_storing_anything(collection, uri, code):
    with pytest.raises(KBError) as error:
        ingest(collection, uri, [])
    assert error.value.code == code
    assert not Document.objects.exists()


@pytest.mark.parametrize("uri", ["javascript:alert(1)", "JavaScript:x", "mailto:someone@example.org", "urn:isbn:0451"])
def test_a_uri_of_another_scheme_is_named_as_one_not_taken_for_a_path(collection, tmp_path, uri):
    with pytest.raises(KBError) as error:
        ingest(collection, uri, [tmp_path])  # with file roots: it had been looked for as a file
    assert error.value.code == ErrorCode.INVALID_URI
    assert "use a file:// path, an http(s):// URL or a data: URI" in error.value.message


def test_a_relative_file_name_with_a_colon_is_a_path(collection, tmp_path, monkeypatch):
    (tmp_path / "meeting:notes.md").write_text("# Notes\n\nWe met at ten.")
    monkeypatch.chdir(tmp_path)
    document = ingest(collection, "meeting:notes.md", [tmp_path]).items[0].document
    assert document.raw_content.endswith("We met at ten.")


def test_a_data_uri_over_the_size_cap_is_refused_before_decoding(collection, settings):
    settings.KB_DATA_URI_MAX_BYTES = 1024
    with pytest.raises(KBError) as error:
        ingest(collection, "data:," + "a" * 5000, [])
    assert error.value.code == ErrorCode.LOAD_FAILED and "KB_DATA_URI_MAX_BYTES" in error.value.message


def test_files_outside_the_roots_cannot_be_read(collection, tmp_path):
    root = tmp_path / "data"
    sibling = tmp_path / "data2"  # shares the prefix "data"
    root.mkdir()
    sibling.mkdir()
    (sibling / "secret.md").write_text("# secret")
    (root / "link.md").symlink_to(sibling / "secret.md")
    (root / "ok.md").write_text("# fine")
    attempts = [
        sibling / "secret.md",
        f"{root}/../data2/secret.md",
        root / "link.md",
        "file:///etc/passwd",
    ]
    for uri in attempts:
        with pytest.raises(KBError) as error:
            ingest(collection, uri, [root])
        assert error.value.code == ErrorCode.INVALID_URI, uri
        assert "outside" in error.value.message
    with pytest.raises(KBError) as error:
        ingest(collection, root / "ok.md", [])
    assert "KB_FILE_ROOTS" in error.value.message
    assert not Document.objects.exists()


def test_a_directory_walk_refuses_links_that_escape_its_root(collection, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "outside.md").write_text("# outside")
    (root / "escape.md").symlink_to(tmp_path / "outside.md")
    (root / "inside.md").write_text("# inside")
    report = ingest(collection, root, [root])
    assert [item.outcome for item in report.items] == ["failed", "created"]
    assert report.failed[0].error.code == ErrorCode.INVALID_URI
    assert Document.objects.get().title == "inside"


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed(tmp_path):
    # confine resolves the path and checks it; a folder on it swapped for a link to a folder
    # outside the roots before the open (a race an attacker can win 1 time in 20) is refused.
    root, outside = tmp_path / "data", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "note.md").write_text("# harmless\n")
    (outside / "note.md").write_text("# secret\n")
    checked = confine(root / "sub" / "note.md", [root])
    (root / "sub").rename(root / "sub.real")
    (root / "sub").symlink_to(outside)
    with pytest.raises(KBError) as error:
        load_file(checked)
    assert error.value.code == ErrorCode.LOAD_FAILED
    (root / "sub").unlink()
    (root / "sub.real").rename(root / "sub")
    assert load_file(checked).data == b"# harmless\n"


def test_links_too_many_to_resolve_are_a_load_failure_of_that_file_only(collection, tmp_path, settings):
    # Python 3.11 resolves links recursively: a chain of 1,000 raised RecursionError (a 500).
    settings.KB_INGEST_MAX_FILES = 1001  # the chain and its end, all in one folder
    root = tmp_path / "data"
    root.mkdir()
    (root / "end.md").write_text("# the end of the chain\n")
    for number in range(1_000):
        (root / f"l{number}.md").symlink_to(f"l{number + 1}.md" if number < 999 else "end.md")
    with pytest.raises(KBError) as error:
        ingest(collection, root / "l0.md", [root])
    assert error.value.code == ErrorCode.LOAD_FAILED and "Cannot resolve" in error.value.message
    report = ingest(collection, root, [root])
    # Links far enough down the chain resolve (to end.md's one document); the rest fail alone.
    assert report.count("created") == 1 and report.count("failed") > 0
    assert {item.error.message.split(" of ")[0] for item in report.failed} == {"Cannot resolve the symbolic links"}


@pytest.fixture
def deep_folder(tmp_path) -> Iterator[Path]:
    """A folder with a file at its top and one 1,100 folders down. Removed here, bottom up:
    shutil.rmtree (pytest's clean-up of old temporary folders) recurses too, and fails on it."""
    root = tmp_path / "data"
    folders = [root]
    for _ in range(1_100):
        folders.append(folders[-1] / "d")
        folders[-1].mkdir(parents=True)
    (folders[-1] / "bottom.md").write_text("# at the bottom\n")
    (root / "top.md").write_text("# at the top\n")
    yield root
    (folders[-1] / "bottom.md").unlink()
    (root / "top.md").unlink()
    for folder in reversed(folders):
        folder.rmdir()


def test_a_folder_a_thousand_levels_deep_is_walked(collection, deep_folder):
    # os.walk recurses in Python 3.11: 1,100 levels raised RecursionError.
    report = ingest(collection, deep_folder, [deep_folder])
    assert sorted(Document.objects.values_list("title", flat=True)) == ["at the bottom", "at the top"]
    assert report.failed == []


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("image.md", b"\x89PNG\r\n\x1a\n" + os.urandom(256), "PNG image"),
        ("noise.txt", bytes(range(256)) * 4, "binary"),
    ],
)
def test_a_file_that_is_not_text_is_refused_with_a_clear_error(collection, tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(KBError) as error:
        ingest(collection, tmp_path / name, [tmp_path])
    assert error.value.code == ErrorCode.LOAD_FAILED
    assert expected in error.value.message
    assert not Document.objects.exists()


def test_latin1_text_is_decoded(collection, tmp_path):
    (tmp_path / "old.txt").write_bytes(
        "Café crème brûlée, déjà vu. Ça va très bien, merci beaucoup.\n".encode("latin-1")
    )
    document = ingest(collection, tmp_path / "old.txt", [tmp_path]).items[0].document
    assert "Café crème brûlée" in document.raw_content


@pytest.mark.parametrize(
    ("data", "kept"),
    [
        ("Café crème brûlée, déjà vu. Ça va très bien. ".encode() * 20 + b"\xff", "Café crème brûlée"),  # a stray byte
        ("Notes: café and crème. ".encode() * 20 + b"then \xed\xa0\x80 (CESU)", "café and crème"),
        ("Un café, s'il vous plaît.\n".encode("cp1252"), "Un café"),  # legacy text: still guessed
    ],
)
def test_utf8_with_a_few_bad_bytes_is_text_with_replacement_characters(collection, tmp_path, data, kept):
    """A French UTF-8 page with one stray byte was refused as no text at all; CESU bytes read as Cyrillic."""
    (tmp_path / "notes.txt").write_bytes(data)
    document = ingest(collection, tmp_path / "notes.txt", [tmp_path]).items[0].document
    assert kept in document.raw_content


def test_files_over_the_size_limit_are_refused(collection, tmp_path, settings):
    settings.KB_MAX_DOCUMENT_BYTES = 2048
    (tmp_path / "big.txt").write_text("word " * 1000)
    with pytest.raises(KBError) as error:
        ingest(collection, tmp_path / "big.txt", [tmp_path])
    assert error.value.code == ErrorCode.LOAD_FAILED and "KB_MAX_DOCUMENT_BYTES" in error.value.message


def test_an_upload_over_the_size_limit_is_refused_before_it_is_read(collection, settings):
    settings.KB_MAX_DOCUMENT_BYTES = 2048
    upload = SimpleUploadedFile("big.txt", b"word " * 1000)
    upload.close()  # reading it now raises ValueError: its recorded size alone must decide
    with pytest.raises(KBError) as error:
        document_ingest_upload(collection=collection, filename="big.txt", data=upload)
    assert error.value.code == ErrorCode.LOAD_FAILED and "5000 bytes" in error.value.message
    assert not Document.objects.exists()


@pytest.mark.parametrize(("name", "content"), [("bad.json", '{"a": 1,,}'), ("bad.yaml", "key: [unclosed\n")])
def test_malformed_structured_text_is_refused(collection, tmp_path, name, content):
    (tmp_path / name).write_text(content)
    with pytest.raises(KBError) as error:
        ingest(collection, tmp_path / name, [tmp_path])
    assert error.value.code == ErrorCode.LOAD_FAILED
    assert not Document.objects.exists()


def test_uploads_are_documents_that_a_second_upload_updates(collection):
    first = document_ingest_upload(collection=collection, filename="notes.md", data=b"# Notes\n\nfirst version\n")
    second = document_ingest_upload(collection=collection, filename="notes.md", data=b"# Notes\n\nsecond version\n")
    assert first.document.source_uri == "upload://notes.md"
    assert (second.outcome, second.document.pk) == ("updated", first.document.pk)
    pdf = document_ingest_upload(collection=collection, filename="p.pdf", data=make_pdf(["Hello pdf"]))
    assert pdf.document.content_type == "pdf"


@pytest.mark.parametrize(
    ("author", "title"),
    [
        ("\\000AB", "Plain"),  # a NUL, as PDF's octal escape
        ("\\376\\377\\330\\000\\000A", "Plain"),  # UTF-16 with a lone surrogate
        ("Smith", "Nul\\000title"),
    ],
)
def test_what_a_pdf_says_of_itself_is_stored_whatever_it_holds(collection, author, title):
    """A PDF whose Author held a NUL or a lone surrogate failed its write with DATABASE_ERROR at every
    door (and stopped a folder's ingest or sync at that file); one whose Title held a NUL was refused
    as if the caller had given that title."""
    stored = document_ingest_upload(
        collection=collection, filename="odd.pdf", data=make_pdf(["Hello"], title=title, author=author)
    )
    document = Document.objects.get(pk=stored.document.pk)
    assert stored.outcome == "created" and document.chunk_count == 1
    assert "\x00" not in document.title + str(document.metadata.get("author"))


def store_first_batch(collection):
    return document_store_chunks(
        collection=collection,
        source_uri="paper.pdf",
        chunks=[ChunkInput(index=0, text="First paragraph.", metadata={"page": 1, "author": "Smith"}),
                ChunkInput(index=1, text="Second paragraph.", metadata={"page": 1})],
    )  # fmt: skip


def test_caller_chunks_are_stored_as_given(collection):
    stored = store_first_batch(collection)
    assert [(c.index, c.content, c.metadata) for c in stored.document.chunks.order_by("index")] == [
        (0, "First paragraph.", {"page": 1, "author": "Smith"}),
        (1, "Second paragraph.", {"page": 1}),
    ]


def test_a_later_batch_of_caller_chunks_merges_into_the_document(collection):
    stored = store_first_batch(collection)
    more = document_store_chunks(
        collection=collection,
        source_uri="paper.pdf",
        chunks=[ChunkInput(index=1, text="Second paragraph, corrected."), ChunkInput(index=2, text="Third.")],
    )
    assert more.document.pk == stored.document.pk
    assert list(more.document.chunks.order_by("index").values_list("index", "content")) == [
        (0, "First paragraph."),
        (1, "Second paragraph, corrected."),
        (2, "Third."),
    ]


def test_a_caller_s_chunk_is_held_to_a_number_of_characters_not_only_of_tokens(collection, settings):
    """3.9 million letters are one unknown token: 25 such chunks had made one search answer 97 MB."""
    settings.KB_MAX_CHUNK_TOKENS = 100  # 1,600 characters
    for text in ("x" * 1_601, "word " * 400):
        with pytest.raises(KBError) as error:
            document_store_chunks(
                collection=collection, source_uri="paper.pdf", chunks=[ChunkInput(index=0, text=text)]
            )
        assert error.value.code == ErrorCode.TEXT_TOO_LONG and "1600" in error.value.message
    document_store_chunks(collection=collection, source_uri="paper.pdf", chunks=[ChunkInput(index=0, text="x" * 1_600)])
    assert Document.objects.get().chunks.get().content == "x" * 1_600


def test_batches_of_a_caller_s_chunks_are_held_to_the_limit_of_a_document_s_text(collection, settings):
    """Batch after batch, one document had grown to 62 MB, each batch slower than the one before."""
    settings.KB_MAX_TEXT_CHARS = 10_000
    for index in range(4):
        chunk = ChunkInput(index=index, text=f"{index} " + "y" * 2_000)
        document_store_chunks(collection=collection, source_uri="paper.pdf", chunks=[chunk])
    with pytest.raises(KBError) as error:
        fifth = ChunkInput(index=4, text="4 " + "y" * 2_000)
        document_store_chunks(collection=collection, source_uri="paper.pdf", chunks=[fifth])
    assert error.value.code == ErrorCode.TEXT_TOO_LONG and "KB_MAX_TEXT_CHARS" in error.value.message
    assert Document.objects.get().chunk_count == 4


def test_two_concurrent_ingests_of_one_source_end_in_one_document(transactional_db, tmp_path):
    collection = collection_create(name="race")
    (tmp_path / "same.md").write_text(MARKDOWN)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            outcomes.append(ingest(collection, tmp_path / "same.md", [tmp_path]).items[0].outcome)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(outcomes) == ["created", "unchanged"]
    assert Document.objects.count() == 1
    assert Chunk.objects.count() == Document.objects.get().chunk_count
    assert not Embedding.objects.exists()


@pytest.mark.parametrize("where", ["document", "chunk"])
def test_metadata_longer_than_the_limit_is_refused(collection, settings, where):
    # Every search hit carries its metadata: one document's 2 MB had emptied MCP searches of every collection.
    settings.KB_MAX_METADATA_CHARS = 200
    big = {"notes": "n" * 300}
    with pytest.raises(KBError) as error:
        document_store_chunks(
            collection=collection,
            source_uri="paper.pdf",
            chunks=[ChunkInput(index=0, text="First paragraph.", metadata=big if where == "chunk" else {})],
            metadata=big if where == "document" else None,
        )
    assert error.value.code == ErrorCode.INVALID_ARGUMENT and "KB_MAX_METADATA_CHARS" in error.value.message
    with pytest.raises(KBError):
        ingest(collection, "data:,some text", [], metadata=big)
    assert not Document.objects.exists()
    ingest(collection, "data:,some text", [], metadata={"notes": "n" * 150})
    assert Document.objects.count() == 1


def test_a_request_of_many_files_stops_reading_them_when_its_time_runs_out(collection, settings, tmp_path):
    """100 uploads or a folder of 1,000 files, each within its own parse budget, had kept a web
    thread for half an hour: past KB_INGEST_REQUEST_SECONDS the rest is reported as not read."""
    from kb.services.uploads import document_ingest_uploads

    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n\nAbout wings.\n")
    uploads = [SimpleUploadedFile(name, b"About wings.") for name in ("a.txt", "b.txt")]
    assert len(ingest(collection, str(tmp_path), [tmp_path]).items) == 2
    assert len(document_ingest_uploads(collection=collection, uploads=uploads).items) == 2
    settings.KB_INGEST_REQUEST_SECONDS = 0  # spent before the first file
    folder = ingest(collection, str(tmp_path), [tmp_path], force=True)
    assert [(item.source_uri, item.outcome) for item in folder.items] == [(tmp_path.as_uri(), "failed")]
    assert "KB_INGEST_REQUEST_SECONDS" in folder.items[0].error.message
    uploaded = document_ingest_uploads(collection=collection, uploads=uploads)
    assert [item.outcome for item in uploaded.items] == ["failed", "failed"]
    assert all("KB_INGEST_REQUEST_SECONDS" in item.error.message for item in uploaded.items)
