"""Parsing bombs (issue 11): documents small on disk that would make a parser spend unbounded time or
memory are refused through the real ingestion service with LOAD_FAILED, a message naming the budget
(a setting), and nothing written. The bombs are built here, a few KB to a few hundred KB each.
Ordinary documents still parse to the text they always gave."""

import base64
import io
import struct
import tracemalloc
import zipfile
import zlib

import pytest
from django.core.files.base import ContentFile

from kb.errors import ErrorCode, KBError
from kb.ingestion import docx_text, formats, html_text
from kb.ingestion.formats import parse
from kb.models import Chunk, Document
from kb.services.collections import collection_create
from kb.services.ingest import document_ingest, document_ingest_upload
from tests.support.documents import make_docx, make_pdf

WORD = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


@pytest.fixture
def collection(db):
    return collection_create(name="bombs")


def written() -> tuple[int, int]:
    return Document.objects.count(), Chunk.objects.count()


def refused_upload(collection, filename: str, data: bytes) -> str:
    """The LOAD_FAILED message an upload gets; asserts that nothing was written."""
    before = written()
    with pytest.raises(KBError) as error:
        document_ingest_upload(collection=collection, filename=filename, data=data)
    assert error.value.code == ErrorCode.LOAD_FAILED, error.value
    assert written() == before
    return error.value.message


def refused_data_uri(collection, data: bytes, content_type: str | None = None) -> str:
    """The same for a data: URI; without a content type, the format is recognised from the bytes."""
    before = written()
    uri = "data:;base64," + base64.b64encode(data).decode()
    with pytest.raises(KBError) as error:
        document_ingest(collection=collection, uri=uri, file_roots=[], content_type=content_type)
    assert error.value.code == ErrorCode.LOAD_FAILED, error.value
    assert written() == before
    return error.value.message


# --- DOCX and other ZIP-based formats --------------------------------------------------------------


def rebuilt_docx(*, document_xml: bytes | None = None, extra_parts: dict[str, bytes] | None = None) -> bytes:
    """An ordinary DOCX with its main document replaced, and parts replaced or added."""
    base = make_docx(title="Report", heading="Results", paragraphs=["Ingestion doubled."])
    parts = dict(extra_parts or {})
    if document_xml is not None:
        parts["word/document.xml"] = document_xml
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for entry in source.infolist():
            target.writestr(entry.filename, parts.pop(entry.filename, None) or source.read(entry.filename))
        for name, data in parts.items():
            target.writestr(name, data)
    return out.getvalue()


def body(content: bytes) -> bytes:
    return f'<w:document xmlns:w="{WORD}"><w:body>'.encode() + content + b"</w:body></w:document>"


def docx_with_zeros_part(size: int) -> bytes:
    """A DOCX with one part of ``size`` zero bytes, written in pieces so the test itself stays small."""
    out = io.BytesIO(rebuilt_docx())
    with (
        zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as archive,
        archive.open("word/media/image1.png", "w", force_zip64=True) as part,
    ):
        for _ in range(size // (1024 * 1024)):
            part.write(bytes(1024 * 1024))
    return out.getvalue()


def test_a_docx_part_that_inflates_to_hundreds_of_mb_is_refused_before_it_is_read(collection):
    bomb = docx_with_zeros_part(400 * 1024 * 1024)
    assert len(bomb) < 1024 * 1024
    message = refused_upload(collection, "bomb.docx", bomb)
    assert "image1.png" in message and "KB_ARCHIVE_MAX_ENTRY_BYTES" in message


def test_a_docx_part_that_inflates_a_thousandfold_is_refused(collection):
    message = refused_upload(collection, "bomb.docx", docx_with_zeros_part(2 * 1024 * 1024))
    assert "KB_ARCHIVE_MAX_RATIO" in message


def test_a_million_empty_paragraphs_are_refused(collection):
    bomb = rebuilt_docx(document_xml=body(b"<w:p/>" * 1_000_000))
    assert len(bomb) < 100 * 1024
    message = refused_upload(collection, "bomb.docx", bomb)
    assert "word/document.xml" in message and "KB_ARCHIVE_MAX_RATIO" in message


def test_a_million_empty_paragraphs_under_a_raised_ratio_are_read_as_a_stream(collection, settings):
    """What python-docx took minutes over is streamed, keeping no paragraph once read."""
    settings.KB_ARCHIVE_MAX_RATIO = 10_000
    bomb = rebuilt_docx(document_xml=body(b"<w:p/>" * 1_000_000))
    assert "has no text" in refused_upload(collection, "bomb.docx", bomb)


def test_a_docx_is_read_in_a_child_process_stopped_at_its_time_budget(collection, settings, parsing_children):
    """Streaming bounds memory, not time: six million empty paragraphs (88 KB deflated under a
    raised ratio; stored, 36 MB within the default one) took 25 s of Python callbacks, which the
    web process spent holding its GIL."""
    settings.KB_ARCHIVE_MAX_RATIO = 100_000
    settings.KB_DOCX_TIMEOUT_SECONDS = 1
    bomb = rebuilt_docx(document_xml=body(b"<w:p/>" * 6_000_000))
    assert "took more than 1 s (KB_DOCX_TIMEOUT_SECONDS)" in refused_upload(collection, "slow.docx", bomb)
    assert parsing_children == ["kb.ingestion.docx_text"]


def test_a_docx_reader_out_of_memory_names_its_budget(collection, settings):
    # The reader streams, so its memory follows the text (held to KB_MAX_TEXT_CHARS): 20 MB of text
    # in one run outgrows an address space of 64 MiB, of which the interpreter and lxml take 25.
    settings.KB_DOCX_MAX_MEMORY_BYTES = 64 * 1024 * 1024
    settings.KB_MAX_TEXT_CHARS = 32 * 1024 * 1024
    settings.KB_ARCHIVE_MAX_RATIO = 100_000
    text = b"<w:p><w:r><w:t>" + b"word " * 4_000_000 + b"</w:t></w:r></w:p>"
    with pytest.raises(KBError) as error:
        parse(rebuilt_docx(document_xml=body(text)), content_type="docx")
    assert error.value.code == ErrorCode.LOAD_FAILED
    assert (
        error.value.message
        == "Reading the DOCX file needed more than 67108864 bytes of memory (KB_DOCX_MAX_MEMORY_BYTES)"
    )


def test_a_docx_whose_deflate_stream_is_corrupt_is_unreadable_not_over_a_budget(collection):
    data = bytearray(rebuilt_docx(document_xml=body(b"<w:p><w:r><w:t>words</w:t></w:r></w:p>" * 2_000)))
    start = data.index(b"word/document.xml") + len("word/document.xml")  # its local header's name, then data
    data[start + 30 : start + 70] = bytes(range(40))  # "invalid literal/lengths set"
    message = refused_upload(collection, "corrupt.docx", bytes(data))
    assert message.startswith("The DOCX file could not be read: "), message
    assert "KB_DOCX" not in message


def test_a_docx_created_at_the_epoch_keeps_that_date(collection):
    core = (
        '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" '
        'xmlns:dcterms="http://purl.org/dc/terms/"><dcterms:created>1970-01-01T00:00:00Z</dcterms:created>'
        "<dcterms:modified>2024-05-01T12:00:00+02:00</dcterms:modified></cp:coreProperties>"
    )
    parsed = parse(rebuilt_docx(extra_parts={"docProps/core.xml": core.encode()}), content_type="docx")
    assert parsed.metadata == {"creation_date": 0.0, "modification_date": 1714557600.0}


def with_first_directory_entry(data: bytes, change) -> bytes:  # change(the bytes, the entry's offset)
    changed = bytearray(data)
    change(changed, changed.index(b"PK\x01\x02"))
    return bytes(changed)


def test_a_docx_needing_a_zip_version_zipfile_does_not_know_is_unreadable(collection):
    # "version needed to extract" 9.9: NotImplementedError, a 500 at every door, and one such file
    # in a folder had stopped its whole sync.
    data = with_first_directory_entry(rebuilt_docx(), lambda zip_, at: struct.pack_into("<H", zip_, at + 6, 99))
    assert refused_upload(collection, "version.docx", data) == "The DOCX file could not be read: zip file version 9.9"


def test_a_zip_whose_names_are_not_the_utf8_its_flag_says_is_no_docx(collection):
    def bad_name(zip_: bytearray, at: int) -> None:
        flags = struct.unpack_from("<H", zip_, at + 8)[0]
        struct.pack_into("<H", zip_, at + 8, flags | 0x800)
        zip_[at + 46] = 0xFF

    data = with_first_directory_entry(rebuilt_docx(), bad_name)
    assert formats.detect_content_type(data=data, filename="noext") == "plain_text"  # sniffed: not a DOCX
    assert refused_upload(collection, "noext", data) == "The content is a ZIP archive, not a supported document format"


def test_one_file_a_parser_fails_on_unforeseen_is_refused_and_the_others_of_its_upload_are_stored(
    collection, monkeypatch
):
    from kb.services.uploads import document_ingest_uploads

    real_zipfile = zipfile.ZipFile

    def failing_library(file, *args, **kwargs):  # zipfile's own failure, as on a hostile file
        if args or kwargs:
            return real_zipfile(file, *args, **kwargs)
        raise LookupError("an error the library's authors did not foresee")

    data = rebuilt_docx()
    monkeypatch.setattr(zipfile, "ZipFile", failing_library)
    files = [
        ContentFile(b"# First", name="first.md"),
        ContentFile(data, name="odd.docx"),
        ContentFile(b"# Third", name="third.md"),
    ]
    report = document_ingest_uploads(collection=collection, uploads=files)
    outcomes = [(item.source_uri, item.outcome, item.error and item.error.message) for item in report.items]
    assert outcomes == [
        ("upload://first.md", "created", None),
        ("upload://odd.docx", "failed", "The file could not be read as docx"),
        ("upload://third.md", "created", None),
    ]
    assert report.items[1].error.code == ErrorCode.LOAD_FAILED


CORE = (
    '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" '
    'xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/">%s</cp:coreProperties>'
)


def test_a_docx_without_the_styles_and_properties_its_relationships_name_is_read(collection):
    base = rebuilt_docx()
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as source, zipfile.ZipFile(out, "w") as target:
        for entry in source.infolist():
            if entry.filename not in ("word/styles.xml", "docProps/core.xml"):
                target.writestr(entry.filename, source.read(entry.filename))
    parsed = parse(out.getvalue(), content_type="docx")
    assert "Ingestion doubled." in parsed.text and parsed.title == ""


def test_a_docx_date_no_clock_can_show_is_left_out(collection):
    # An OverflowError in the reader had refused the whole file.
    dates = "<dcterms:created>0001-01-01T00:00:00+01:00</dcterms:created><dcterms:modified>9999-12-31T23:59:59-01:00</dcterms:modified>"
    parsed = parse(rebuilt_docx(extra_parts={"docProps/core.xml": (CORE % dates).encode()}), content_type="docx")
    assert "Ingestion doubled." in parsed.text and parsed.metadata == {}


def test_a_pdf_date_no_clock_can_show_is_left_out(collection):
    parsed = parse(make_pdf(["Year one"], title="Old", created="D:00010101000000"), content_type="pdf")
    assert "Year one" in parsed.text
    assert parsed.metadata == {"page_count": 1, "title": "Old"}


def test_a_nul_in_a_pdf_s_text_is_stored_as_a_replacement_character(collection):
    # Broken font encodings make pypdf give NULs; they had been refused as if the caller sent them.
    stored = document_ingest_upload(collection=collection, filename="nul.pdf", data=make_pdf(["x\x00y and more"]))
    assert "x\ufffdy and more" in Document.objects.get(pk=stored.document.pk).raw_content


def test_a_docx_title_of_a_hundred_thousand_entities_is_read_in_linear_time(collection, settings):
    settings.KB_DOCX_TIMEOUT_SECONDS = 5  # joined anew for each entity, it took 11 s
    core = (CORE % ("<dc:title>" + "abcde&amp;" * 100_000 + "</dc:title>")).encode()
    parsed = parse(rebuilt_docx(extra_parts={"docProps/core.xml": core}), content_type="docx")
    assert parsed.title == ("abcde&" * 100)[: formats.FILE_METADATA_MAX_CHARS]


def test_elements_nested_deep_in_a_paragraph_are_read_in_linear_time(collection, settings):
    settings.KB_DOCX_TIMEOUT_SECONDS = 5  # copying the path below the paragraph for each, 20 s
    paragraph = b"<w:p><w:r><w:t>kept</w:t></w:r>" + b"<x>" * 140_000 + b"</x>" * 140_000 + b"</w:p>"
    assert parse(rebuilt_docx(document_xml=body(paragraph)), content_type="docx").text == "kept\n"


def test_a_file_waits_for_a_parsing_slot_no_longer_than_its_budget(collection, settings):
    settings.KB_DOCX_TIMEOUT_SECONDS = 1
    held = 0
    while formats._parsing_slots.acquire(blocking=False):  # every slot busy with another file
        held += 1
    try:
        message = refused_upload(collection, "waiting.docx", rebuilt_docx())
    finally:
        for _ in range(held):
            formats._parsing_slots.release()
    assert held >= 1
    assert message == "Reading the DOCX file waited more than 1 s for the other files being read to finish; try again"


def test_a_docx_with_too_many_entries_is_refused_before_they_are_listed(collection):
    parts = {f"customXml/extra{number}.xml": b"<a/>" for number in range(6000)}
    message = refused_upload(collection, "bomb.docx", rebuilt_docx(extra_parts=parts))
    assert "KB_ARCHIVE_MAX_ENTRIES" in message


def docx_with_uncounted_entries(extra: int) -> bytes:
    """An ordinary DOCX whose directory gains ``extra`` records (47 bytes each, no data), while its
    end record still counts only the real ones: zipfile reads every record the directory's size
    covers, whatever that count says."""
    data = rebuilt_docx()
    end = data.rindex(b"PK\x05\x06")
    directory_size, directory_offset = (
        int.from_bytes(data[end + 12 : end + 16], "little"),
        int.from_bytes(data[end + 16 : end + 20], "little"),
    )
    record = b"PK\x01\x02" + bytes(24) + (1).to_bytes(2, "little") + bytes(16) + b"a"
    directory = data[directory_offset:end] + record * extra
    assert len(directory) == directory_size + 47 * extra
    end_record = data[end : end + 12] + len(directory).to_bytes(4, "little") + data[end + 16 :]
    return data[:directory_offset] + directory + end_record


def test_a_docx_whose_end_record_understates_its_entries_is_refused_before_they_are_listed(collection):
    bomb = docx_with_uncounted_entries(6000)
    with zipfile.ZipFile(io.BytesIO(bomb)) as archive:
        assert len(archive.infolist()) > 6000  # what zipfile would list
    message = refused_upload(collection, "bomb.docx", bomb)
    assert "KB_ARCHIVE_MAX_ENTRIES" in message


def test_a_docx_at_the_entry_budget_is_read(collection, settings):
    """Counting the records refuses nothing at the budget itself."""
    with zipfile.ZipFile(io.BytesIO(rebuilt_docx())) as archive:
        real_entries = len(archive.infolist())
    data = docx_with_uncounted_entries(settings.KB_ARCHIVE_MAX_ENTRIES - real_entries)
    stored = document_ingest_upload(collection=collection, filename="ok.docx", data=data)
    assert stored.document.chunk_count >= 1


def test_a_docx_with_150_000_relationships_and_styles_is_read_in_bounded_memory(collection, settings):
    """Relationships and styles are not held whole: only the targets and styles that are used, up
    to a cap (the parts below are 10-20 MB of XML; keeping them all took 110 MB of Python objects)."""
    settings.KB_ARCHIVE_MAX_RATIO = 10_000
    count = 150_000
    relationship = '<Relationship Id="r%d" Type="http://x/relationships/officeDocument%d" Target="t%d.xml"/>'
    relationships = "".join(relationship % (n, n, n) for n in range(count))
    styles = "".join(
        f'<w:style w:type="paragraph" w:styleId="s{n}"><w:name w:val="S {n}"/></w:style>' for n in range(count)
    )
    base = rebuilt_docx()
    with zipfile.ZipFile(io.BytesIO(base)) as archive:
        package_rels = (
            archive.read("_rels/.rels").decode().replace("</Relationships>", relationships + "</Relationships>")
        )
        document_rels = archive.read("word/_rels/document.xml.rels").decode()
        document_rels = document_rels.replace("</Relationships>", relationships + "</Relationships>")
        style_part = archive.read("word/styles.xml").decode().replace("</w:styles>", styles + "</w:styles>")
    replaced = {
        "_rels/.rels": package_rels,
        "word/_rels/document.xml.rels": document_rels,
        "word/styles.xml": style_part,
    }
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for entry in source.infolist():
            target.writestr(entry.filename, replaced.get(entry.filename) or source.read(entry.filename))
    data = out.getvalue()
    formats.parse(data, content_type="docx")  # the archive passes the budgets the web process checks
    tracemalloc.start()
    try:  # measured in this process: what the child process would hold
        content = docx_text.extract(data, max_text_chars=settings.KB_MAX_TEXT_CHARS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "Ingestion doubled." in content["blocks"]
    assert peak < 20 * 1024 * 1024, f"{peak / 2**20:.0f} MB of Python objects at the peak"


def test_a_docx_whose_parts_add_up_past_the_total_is_refused(collection, settings):
    settings.KB_ARCHIVE_MAX_TOTAL_BYTES = 1024 * 1024
    parts = {f"word/media/image{number}.png": bytes(range(256)) * 2048 for number in range(3)}  # 512 KB each
    assert "KB_ARCHIVE_MAX_TOTAL_BYTES" in refused_upload(collection, "big.docx", rebuilt_docx(extra_parts=parts))


def test_a_docx_whose_directory_understates_a_part_is_not_read_past_it(collection):
    """A million empty paragraphs declared as 1 KB pass the size and ratio checks; reading stops at
    the declared 1 KB (and fails its checksum) instead of parsing the rest."""
    honest = rebuilt_docx(document_xml=body(b"<w:p/>" * 1_000_000))
    lying = bytearray(honest)
    entry = lying.rindex(b"word/document.xml") - 46  # the part's central directory entry
    assert lying[entry : entry + 4] == b"PK\x01\x02"
    lying[entry + 24 : entry + 28] = (1024).to_bytes(4, "little")  # its declared uncompressed size
    assert "could not be read" in refused_upload(collection, "lying.docx", bytes(lying))


def test_merged_cells_cannot_multiply_a_small_docx_into_a_huge_text(collection, settings):
    """Each row's vertically merged cell repeats the first row's 10 KB: 2000 rows would make 20 MB."""
    settings.KB_MAX_TEXT_CHARS = 1024 * 1024
    first = b"<w:tr><w:tc><w:tcPr><w:vMerge w:val='restart'/></w:tcPr><w:p><w:r><w:t>%s</w:t></w:r></w:p></w:tc></w:tr>"
    repeat = b"<w:tr><w:tc><w:tcPr><w:vMerge/></w:tcPr><w:p/></w:tc></w:tr>"
    bomb = rebuilt_docx(document_xml=body(b"<w:tbl>" + first % (b"x" * 10_000) + repeat * 2000 + b"</w:tbl>"))
    assert len(bomb) < 100 * 1024
    assert "KB_MAX_TEXT_CHARS" in refused_upload(collection, "cells.docx", bomb)


def test_empty_cells_spanning_many_columns_cannot_make_a_huge_text(collection, settings):
    """Each empty cell spanning 64 columns adds 64 separators and was counted as nothing: a 1 MB
    file had become 288 million characters."""
    settings.KB_MAX_TEXT_CHARS = 100_000
    cell = b"<w:tc><w:tcPr><w:gridSpan w:val='64'/></w:tcPr><w:p/></w:tc>"
    bomb = rebuilt_docx(document_xml=body(b"<w:tbl>" + (b"<w:tr>" + cell * 20 + b"</w:tr>") * 100 + b"</w:tbl>"))
    assert len(bomb) < 48 * 1024  # most of it the template's thumbnail
    assert "The DOCX file's text is longer than 100000 characters" in refused_upload(collection, "spans.docx", bomb)


def test_the_blank_lines_between_paragraphs_count_towards_the_text_limit(collection, settings):
    settings.KB_MAX_TEXT_CHARS = 10_000
    paragraphs = b"<w:p><w:r><w:t>a</w:t></w:r></w:p>" * 4_000  # 4,000 letters, 12,000 characters of text
    message = refused_upload(collection, "letters.docx", rebuilt_docx(document_xml=body(paragraphs)))
    assert "The DOCX file's text is longer than 10000 characters" in message
    settings.KB_MAX_TEXT_CHARS = 12_000
    assert parse(rebuilt_docx(document_xml=body(paragraphs)), content_type="docx").text.count("a") == 4_000


def test_a_docx_part_declaring_xml_entities_is_refused(collection):
    laughs = b'<!DOCTYPE d [<!ENTITY a "lol"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
    document = laughs + body(b"<w:p><w:r><w:t>Plain text &b;</w:t></w:r></w:p>")
    assert "declares a DTD" in refused_upload(collection, "entities.docx", rebuilt_docx(document_xml=document))


# --- PDF ---------------------------------------------------------------------------------------------


def pdf_with_shared_content(*, pages: int, content: bytes) -> bytes:
    """A PDF whose pages all draw the same compressed content stream."""
    packed = zlib.compress(content, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (5 + n) for n in range(pages)), pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(packed), packed),
    ]
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 3 0 R >> >> >>"
    objects += [page] * pages
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, text in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, text))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def test_pages_sharing_a_content_stream_of_megabytes_are_stopped_at_the_time_budget(collection, settings):
    settings.KB_PDF_TIMEOUT_SECONDS = 2
    drawing = b"BT /F1 12 Tf 72 720 Td (x) Tj ET\n" * 150_000  # 5 MB of text operations
    bomb = pdf_with_shared_content(pages=20, content=drawing)
    assert len(bomb) < 64 * 1024
    message = refused_upload(collection, "shared.pdf", bomb)
    assert "KB_PDF_TIMEOUT_SECONDS" in message


def test_a_content_stream_that_inflates_past_the_memory_budget_is_refused(collection, settings):
    settings.KB_PDF_MAX_MEMORY_BYTES = 128 * 1024 * 1024
    bomb = pdf_with_shared_content(pages=1, content=b" " * (70 * 1024 * 1024))
    assert len(bomb) < 256 * 1024
    assert "KB_PDF_MAX_MEMORY_BYTES" in refused_upload(collection, "inflating.pdf", bomb)


def test_a_pdf_over_the_page_budget_is_refused(collection, settings):
    settings.KB_PDF_MAX_PAGES = 3
    message = refused_upload(collection, "long.pdf", make_pdf([f"Page {n}" for n in range(5)]))
    assert "5 pages" in message and "KB_PDF_MAX_PAGES" in message


def test_a_pdf_yielding_more_text_than_a_document_may_hold_is_refused(collection, settings):
    settings.KB_MAX_TEXT_CHARS = 64 * 1024
    drawing = b"BT /F1 12 Tf 72 720 Td (%s) Tj ET\n" % (b"x" * 1000)
    bomb = pdf_with_shared_content(pages=100, content=drawing)
    assert "KB_MAX_TEXT_CHARS" in refused_upload(collection, "wordy.pdf", bomb)


@pytest.mark.parametrize(
    "data",
    [b"\xff\xfe" + "hello".encode("utf-16-le") + b"\x00\xd8", b"\xfe\xff" + "hello".encode("utf-16-be") + b"!"],
    ids=["lone surrogate", "odd byte"],
)
def test_text_that_starts_as_utf16_but_is_not_is_refused_not_a_server_error(collection, data):
    assert "UTF-16" in refused_upload(collection, "note.txt", data)
    assert "UTF-16" in refused_data_uri(collection, data)


@pytest.mark.parametrize("multiplier", [1, 5])  # over the limit in characters; over 4x it in bytes
def test_a_plain_text_longer_than_a_document_may_hold_is_refused(collection, settings, multiplier):
    settings.KB_MAX_TEXT_CHARS = 10_000
    message = refused_upload(collection, "long.txt", b"lift and drag " * (1000 * multiplier))
    assert "KB_MAX_TEXT_CHARS" in message


# --- JSON, YAML, HTML --------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "json"])
def test_deeply_nested_json_is_refused_by_its_depth_not_a_recursion_error(collection, content_type):
    message = refused_data_uri(collection, b"[" * 100_000 + b"]" * 100_000, content_type)
    assert "JSON" in message and "KB_PARSE_MAX_DEPTH" in message


def test_brackets_inside_json_strings_are_not_nesting(collection):
    text = '{"note": "' + "[" * 1000 + '", "escaped \\" [[[[": [1, 2]}'
    stored = document_ingest_upload(collection=collection, filename="brackets.json", data=text.encode())
    assert stored.document.raw_content == text


def test_a_json_string_that_never_closes_is_measured_in_one_pass(collection):
    # With the closing quote required, each of these quotes started a scan to the end of the text:
    # 4.7 s of CPU at 20,000 of them, about half an hour at 400,000 (past the test's timeout).
    message = refused_upload(collection, "open.json", b'["' + b'\\"' * 400_000 + b"[[[")
    assert "not valid JSON" in message


@pytest.mark.parametrize(
    "yaml_text",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b"- " * 100_000 + b"x\n",
        b"a:\n" + b"".join(b"  " * n + b"b:\n" for n in range(1, 300)),
    ],
    ids=["flow", "compact sequences", "indented mappings"],
)
def test_deeply_nested_yaml_is_refused_by_its_depth(collection, yaml_text):
    message = refused_upload(collection, "deep.yaml", yaml_text)
    assert "YAML" in message and "KB_PARSE_MAX_DEPTH" in message


BILLION_LAUGHS = b'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + b"".join(
    b"a%d: &a%d [%s]\n" % (level, level, b",".join([b"*a%d" % (level - 1)] * 9)) for level in range(1, 9)
)
# Merge keys make PyYAML really copy: this one took seconds per level when loaded, each level nine times more.
MERGE_KEY_LAUGHS = b"a0: &a0 {k: 1}\n" + b"".join(
    b"a%d: &a%d {<<: [%s]}\n" % (level, level, b",".join([b"*a%d" % (level - 1)] * 9)) for level in range(1, 12)
)


@pytest.mark.parametrize("yaml_text", [BILLION_LAUGHS, MERGE_KEY_LAUGHS], ids=["aliases", "merge keys"])
def test_yaml_aliases_that_expand_to_billions_of_nodes_are_refused(collection, yaml_text):
    assert len(yaml_text) < 1024
    assert "KB_YAML_MAX_ALIAS_NODES" in refused_upload(collection, "laughs.yaml", yaml_text)


def test_yaml_anchors_as_configuration_files_use_them_are_accepted(collection):
    text = "defaults: &defaults\n  image: kb\n  restart: always\nweb:\n  <<: *defaults\n  port: 8001\nworker:\n  <<: *defaults\n"
    stored = document_ingest_upload(collection=collection, filename="compose.yaml", data=text.encode())
    assert stored.document.raw_content == text


@pytest.mark.parametrize("yaml_text", [b"a: *nowhere\n", b"a: &x 1\nb: &x 2\n"], ids=["undefined", "duplicate"])
def test_yaml_with_bad_anchors_is_still_invalid(collection, yaml_text):
    assert "not valid YAML" in refused_upload(collection, "anchors.yaml", yaml_text)


def test_deeply_nested_html_is_refused_by_its_depth(collection):
    page = b"<html><body>" + b"<div>" * 5_000 + b"deep text" + b"</div>" * 5_000 + b"</body></html>"
    message = refused_data_uri(collection, page)
    assert "HTML" in message and "KB_PARSE_MAX_DEPTH" in message


def test_an_html_page_with_too_many_elements_is_refused(collection):
    page = b"<html><body>" + b"<p>x</p>" * 30_000 + b"</body></html>"
    assert "KB_HTML_MAX_ELEMENTS" in refused_upload(collection, "huge.html", page)


@pytest.fixture
def parsing_children(monkeypatch) -> list[str]:
    """The modules run in a parsing child process (HTML pages are parsed only there)."""
    started: list[str] = []
    extract_in_child = formats._extract_in_child
    monkeypatch.setattr(
        formats,
        "_extract_in_child",
        lambda module, *a, **k: started.append(module.__name__) or extract_in_child(module, *a, **k),
    )
    return started


@pytest.mark.parametrize(
    "nodes",
    [b"<br>" * 30_000, b"<!-->" * 30_000, b"<!x>" * 30_000],
    ids=["elements", "comments", "declarations"],
)
def test_an_html_page_with_too_many_nodes_is_refused_before_it_is_parsed(collection, parsing_children, nodes):
    # 20 MB of <br> made a 716 MB tree before the elements were counted on it; 20 MB of "<!-->",
    # each a comment node, 645 MB.
    page = b"<html><body><p>text</p>" + nodes + b"</body></html>"
    assert "KB_HTML_MAX_ELEMENTS" in refused_upload(collection, "breaks.html", page)
    assert parsing_children == []


@pytest.mark.parametrize(
    "markup",
    [
        "<script>if (a<b && c<d) {{ s = '<div class=\"x\">{n}'; }}</script>",
        "<style>p<b {{ color: red }} /* {n} */</style>",
        "<!-- <div><span>{n}</span> -->",
        "<!--> <b>{n}</b> <!---> <i>{n}</i>",
        "<title>a <b>bold</b> title {n}</title><textarea><u>{n}</u></textarea>",
        "<script/><b>{n}</b></script><script a=1/><b>{n}</b></script>",
        "<!x <script>><b>{n}</b></script x<i>>",
        "</b title='><script>'><i>{n}</i><?php echo '<u>' ?>",
        "<SCRIPT type='a>b'><b>{n}</b></SCRIPT\n><u>{n}</u>",
    ],
    ids=[
        "script",
        "style",
        "comment",
        "short comments",
        "title and textarea",
        "self-closed script",
        "script in a declaration",
        "script in an end tag",
        "script spelled otherwise",
    ],
)
def test_the_elements_of_a_page_are_counted_as_its_parser_counts_them(settings, parsing_children, markup):
    from lxml import etree

    body = "".join(f"<p>Paragraph {n} of the page.</p>" + markup.format(n=n) for n in range(4))
    page = f"<meta charset=utf-8>{body}".encode()  # the parser adds <html>, <head> and <body>
    counted_by_parser = sum(1 for _ in etree.HTML(page).iter())  # elements and comments
    settings.KB_HTML_MAX_ELEMENTS = counted_by_parser
    assert "Paragraph 3 of the page." in parse(page, content_type="html").text
    settings.KB_HTML_MAX_ELEMENTS = counted_by_parser - 1
    parsing_children.clear()
    with pytest.raises(KBError, match="KB_HTML_MAX_ELEMENTS"):
        parse(page, content_type="html")
    assert parsing_children == []  # refused by the count, not by the parser's own


def test_a_script_full_of_comparisons_does_not_count_as_elements(collection, settings):
    # Counting every "<" and a letter, 30,000 "i<n" in a script had refused an ordinary page.
    script = "".join(f"for (i = 0; i<n{k}; i++) {{}}\n" for k in range(30_000))
    page = f"<html><body><script>{script}</script><p>The page's own text.</p></body></html>".encode()
    stored = document_ingest_upload(collection=collection, filename="app.html", data=page)
    assert "The page's own text." in "".join(
        Chunk.objects.filter(document=stored.document).values_list("content", flat=True)
    )


@pytest.mark.parametrize(
    "attribute",
    ['a{n}=">"', "a{n}=''", "a{n}", "a{n} = v", 'a{n}\r\n=\t"x y"'],
    ids=["'>' in quotes", "quotes without spaces", "bare", "spaces around =", "line breaks and tabs"],
)
@pytest.mark.parametrize("opening", ["<div", "<\x01div", "<\x1fd\x0bi\x0cv"], ids=["plain", "control", "controls"])
def test_a_tag_of_tens_of_thousands_of_attributes_is_refused_before_it_is_parsed(collection, attribute, opening):
    # libxml2 compares each attribute of a tag with every other one: 20,000 cost 3.5 s, 40,000 14 s.
    # trafilatura deletes control characters before libxml2 reads the page: "<\x01div" is a <div>.
    separator = "" if attribute.endswith("''") else " "
    tag = opening + " " + separator.join(attribute.format(n=n) for n in range(40_000)) + ">"
    page = f"<html><body><p>Some readable text.</p>{tag}more text</div></body></html>".encode()
    message = refused_upload(collection, "attributes.html", page)
    assert f"more than {formats.MAX_TAG_ATTRIBUTES} attributes" in message


@pytest.mark.parametrize(
    ("attribute", "separator"),
    [('a{n}=">"', " "), ('a{n}=""', ""), ("a{n}=it's", " "), ("a{n}", "/"), ("a{n} = v", "\n"), ("=a{n}", " ")],
    ids=["'>' in quotes", "quotes without spaces", "apostrophe in a value", "slashes", "spaces around =", "= first"],
)
def test_the_attributes_of_a_page_are_counted_as_its_parser_counts_them(settings, attribute, separator):
    from lxml import etree

    tags = [
        f"<p {separator.join(attribute.format(n=n) for n in range(50))}>Paragraph {k} of the page.</p>"
        for k in range(4)
    ]
    page = ("<html><body>" + "".join(tags) + "</body></html>").encode()
    counted_by_parser = sum(len(element.attrib) for element in etree.HTML(page).iter())
    assert counted_by_parser >= 4 * 25
    settings.KB_HTML_MAX_ATTRIBUTES = counted_by_parser
    assert "Paragraph 3 of the page." in parse(page, content_type="html").text
    settings.KB_HTML_MAX_ATTRIBUTES = counted_by_parser - 1
    with pytest.raises(KBError, match="KB_HTML_MAX_ATTRIBUTES"):
        parse(page, content_type="html")


@pytest.mark.parametrize("opening", ['<div =" ', '<div=" '], ids=["quote after a space", "quote in the name"])
def test_a_quote_after_the_tag_name_hides_no_attributes(collection, parsing_children, opening):
    # Read as one quoted value, these 40,000 attributes (269 KB) were not counted: 8 s of parsing.
    tag = opening + " ".join(f"a{n}" for n in range(40_000)) + '">'
    page = f"<html><body><p>Some readable text.</p>{tag}more text</div></body></html>".encode()
    assert f"more than {formats.MAX_TAG_ATTRIBUTES} attributes" in refused_upload(collection, "quoted.html", page)
    assert parsing_children == []


def test_an_html_page_trafilatura_would_spend_minutes_and_gigabytes_on_is_stopped_at_its_budget(collection, settings):
    # Markdown output joins adjacent bold runs in time and memory in the square of their number:
    # 8,000 in one paragraph (1.6 MB) took 56 s and 11.8 GB in the web process.
    settings.KB_HTML_TIMEOUT_SECONDS, settings.KB_HTML_MAX_MEMORY_BYTES = 3, 512 * 1024 * 1024
    runs = "".join(f"<b>run {n} " + "lorem ipsum " * 16 + "</b>" for n in range(4_000))  # 0.8 MB: 1.8 GB
    page = f"<html><head><title>t</title></head><body><p>{runs}</p></body></html>".encode()
    message = refused_upload(collection, "bold.html", page)
    assert "KB_HTML_TIMEOUT_SECONDS" in message or "KB_HTML_MAX_MEMORY_BYTES" in message


def test_an_html_page_without_readable_text_says_so(collection):
    page = b"<html><head><script>var x = 'y';</script></head><body></body></html>"
    assert refused_upload(collection, "empty.html", page) == "The HTML page has no readable text"


def test_a_small_html_table_that_spans_into_megabytes_of_text_is_stopped_at_its_budget(collection, settings):
    # Cells spanning 100 rows and columns: 3.3 KB became 1.5 M characters in 7.6 s, 6.7 KB 4.5 M in 27 s.
    settings.KB_HTML_TIMEOUT_SECONDS = 3
    page = ("<html><body><table>" + "<tr><td colspan=100 rowspan=100>a" * 200 + "</table></body></html>").encode()
    assert len(page) < 8 * 1024
    assert "KB_HTML_TIMEOUT_SECONDS" in refused_upload(collection, "spans.html", page)


def test_the_text_of_an_html_page_is_held_to_the_text_budget(collection, settings):
    # Items of a list 45 levels deep are each indented by 90 characters: the text outgrows the page.
    settings.KB_MAX_TEXT_CHARS = 20_000
    page = ("<html><body>" + "<ul><li>x" * 45 + "<li>a" * 500 + "</ul>" * 45 + "</body></html>").encode()
    assert len(page) < 5_000
    assert "KB_MAX_TEXT_CHARS" in refused_upload(collection, "indented.html", page)


def test_an_html_page_extracted_in_the_child_reads_as_in_process(collection):
    sections = "".join(
        f"<h2>Section {n}</h2><p>Paragraph {n} of the <b>report</b>, about wind tunnels and lift.</p>" * 3
        for n in range(200)
    )
    page = f"<html><head><title>Report</title></head><body><article>{sections}</article></body></html>"
    parsed = parse(page.encode(), content_type="html")
    in_process = html_text.extract(page, max_depth=100, max_elements=25_000, max_text_chars=5_000_000)
    assert (parsed.text, parsed.title) == (in_process["text"], "Report")
    assert "## Section 199" in parsed.text and "**report**" in parsed.text


# --- Ordinary documents ------------------------------------------------------------------------------


def test_what_a_file_says_of_itself_is_kept_short(collection):
    # Every search hit carries its document's metadata: a 2 MB author made a 100-hit answer 210 MB.
    long = "Lee " * 50_000
    data = make_pdf(["Lift and drag."], title=long, author=long)
    document = document_ingest_upload(collection=collection, filename="long.pdf", data=data).document
    assert document.title == long[:500]
    assert document.metadata["author"] == long[:500] and document.metadata["title"] == long[:500]


def test_an_ordinary_multi_page_pdf_gives_the_text_it_always_gave(collection):
    pdf = make_pdf(
        ["Lift and drag of slender wings.\nPage one text.", "", "Page three discusses shock waves."],
        title="Wings",
        author="Smith",
    )
    document = document_ingest_upload(collection=collection, filename="wings.pdf", data=pdf).document
    assert document.raw_content == (
        "Lift and drag of slender wings.\nPage one text.\n\n\n\nPage three discusses shock waves.\n"
    )
    assert document.title == "Wings"
    added_by_the_service = {"file_size", "ingestion_date"}
    assert {key: value for key, value in document.metadata.items() if key not in added_by_the_service} == {
        "page_count": 3,
        "author": "Smith",
        "creation_date": 1704164645.0,
        "title": "Wings",
    }
    assert sorted({chunk.page for chunk in document.chunks.all()}) == [1, 3]


def test_an_ordinary_docx_gives_the_text_it_always_gave(collection):
    docx = make_docx(
        title="Quarterly report",
        heading="Results",
        paragraphs=["Ingestion doubled.", "Search got faster."],
        author="Lee",
    )
    document = document_ingest_upload(collection=collection, filename="report.docx", data=docx).document
    assert document.raw_content == (
        "# Quarterly report\n\n## Results\n\nIngestion doubled.\n\nSearch got faster.\n\n"
        "Setting | Value\nmax_tokens | 512\n"
    )
    assert document.title == "Quarterly report"
    added_by_the_service = {"file_size", "ingestion_date"}
    assert {key: value for key, value in document.metadata.items() if key not in added_by_the_service} == {
        "author": "Lee",
        "title": "Quarterly report",
        "creation_date": 1387840500.0,
        "modification_date": 1387840500.0,
    }


def test_a_large_json_of_tiny_arrays_is_not_decoded_into_millions_of_objects():
    import tracemalloc

    bomb = b"[" + b"[]," * 1_500_000 + b"[]]"  # 4.5 MB: decoded, 1.5 million lists (+100 MB)
    tracemalloc.start()
    try:
        parsed = parse(bomb, content_type="json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert parsed.content_type == "json" and len(parsed.text) == len(bomb)
    assert peak < 4 * len(bomb), peak  # the bytes and the text, nothing in proportion to the values


# --- Markdown ---------------------------------------------------------------------------------------


def test_a_heading_of_a_million_spaces_is_parsed_fast_into_a_short_heading(collection):
    # A backtracking heading pattern took quadratic time here (5 s at 20,000 spaces, days at a million).
    heading = "# Lift" + " " * 1_000_000 + "and drag ##\n\nBody text under the heading.\n"
    document_ingest_upload(collection=collection, filename="wide.md", data=heading.encode())
    assert {tuple(chunk.heading_path) for chunk in Chunk.objects.filter(collection=collection)} == {("Lift and drag",)}
