"""Recognising a document's format and turning it into text.

The content type comes from, in order: the caller's override, the file extension, the MIME
type, then the bytes themselves. Binary input that is not a supported document format is
refused with a message that says what it looks like, never stored as garbage.
"""

import io
import json
import mimetypes
import re
import zipfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from kb.errors import ErrorCode, KBError

# The 001 seed's content_type enum, plus the formats and languages we also understand.
CODE_CONTENT_TYPES = ("rust", "python", "typescript", "javascript", "go", "java", "cpp", "c")
OTHER_TEXT_CONTENT_TYPES = ("markdown", "html", "json", "yaml", "plain_text")
BINARY_DOCUMENT_CONTENT_TYPES = ("pdf", "docx")
CONTENT_TYPES = CODE_CONTENT_TYPES + OTHER_TEXT_CONTENT_TYPES + BINARY_DOCUMENT_CONTENT_TYPES
# Chunked by Markdown structure (HTML and DOCX are converted to Markdown first).
MARKDOWN_LIKE_CONTENT_TYPES = ("markdown", "html", "docx")

_EXTENSIONS = {
    ".rs": "rust",
    ".py": "python",
    ".pyi": "python",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".js": "javascript",
    ".jsx": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".go": "go",
    ".java": "java",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".cxx": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".c": "c",
    ".h": "c",
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdx": "markdown",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".pdf": "pdf",
    ".docx": "docx",
}
# Text formats without a dedicated parser; ingested as plain text.
_PLAIN_TEXT_EXTENSIONS = {
    ".txt", ".text", ".log", ".rst", ".adoc", ".csv", ".tsv", ".toml", ".ini", ".cfg", ".conf",
    ".xml", ".sh", ".bash", ".zsh", ".sql", ".rb", ".php", ".cs", ".kt", ".swift", ".scala",
    ".css", ".scss", ".tex", ".org", ".properties", ".env", ".gitignore", ".dockerfile",
}  # fmt: skip
_MIME_TYPES = {
    "text/markdown": "markdown",
    "text/x-markdown": "markdown",
    "text/html": "html",
    "application/xhtml+xml": "html",
    "application/json": "json",
    "application/yaml": "yaml",
    "application/x-yaml": "yaml",
    "text/yaml": "yaml",
    "text/x-yaml": "yaml",
    "application/pdf": "pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "text/x-python": "python",
    "text/x-rust": "rust",
    "text/javascript": "javascript",
    "application/javascript": "javascript",
    "application/typescript": "typescript",
    "text/x-go": "go",
    "text/x-java": "java",
    "text/x-c++src": "cpp",
    "text/x-csrc": "c",
    "text/plain": "plain_text",
}
_BINARY_SIGNATURES = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"PK\x03\x04", "a ZIP archive"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x7fELF", "an executable"),
    (b"\xd0\xcf\x11\xe0", "a legacy Office document"),
    (b"ID3", "an MP3 file"),
)


@dataclass(frozen=True)
class Page:
    """A page of a paged format: its number and where its text lies in the document text."""

    number: int
    start: int
    end: int


@dataclass(frozen=True)
class ParsedDocument:
    text: str
    content_type: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    pages: tuple[Page, ...] = ()


def supported_extension(name: str) -> bool:
    suffix = PurePosixPath(name).suffix.lower()
    return suffix in _EXTENSIONS or suffix in _PLAIN_TEXT_EXTENSIONS


def validate_content_type(content_type: str) -> str:
    normalised = content_type.strip().lower().replace("-", "_")
    normalised = {"text": "plain_text", "plain": "plain_text", "md": "markdown", "c++": "cpp", "yml": "yaml"}.get(
        normalised, normalised
    )
    if normalised not in CONTENT_TYPES:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT,
            f"Unknown content_type {content_type!r}; use one of: {', '.join(CONTENT_TYPES)}",
        )
    return normalised


def detect_content_type(*, data: bytes, filename: str = "", mime_type: str = "", override: str | None = None) -> str:
    if override:
        return validate_content_type(override)
    suffix = PurePosixPath(filename).suffix.lower()
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    if suffix in _PLAIN_TEXT_EXTENSIONS:
        return "plain_text"
    mime = (mime_type or "").split(";")[0].strip().lower()
    if mime in _MIME_TYPES and mime != "text/plain":
        return _MIME_TYPES[mime]
    if not mime and filename:
        guessed, _ = mimetypes.guess_type(filename)
        if guessed in _MIME_TYPES and guessed != "text/plain":
            return _MIME_TYPES[guessed]
    return _sniff(data)


def _sniff(data: bytes) -> str:
    head = data[:4096]
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"PK\x03\x04") and _is_docx(data):
        return "docx"
    text_head = head.lstrip().lower()
    if text_head.startswith((b"<!doctype html", b"<html")) or b"<body" in text_head:
        return "html"
    if text_head.startswith((b"{", b"[")):
        try:
            json.loads(data)
            return "json"
        except ValueError:
            pass
    if re.search(rb"^#{1,6} \S", head, re.MULTILINE) or re.search(rb"^```", head, re.MULTILINE):
        return "markdown"
    return "plain_text"


def _is_docx(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return "word/document.xml" in archive.namelist()
    except zipfile.BadZipFile:
        return False


def parse(data: bytes, *, content_type: str, filename: str = "") -> ParsedDocument:
    if content_type == "pdf":
        return _parse_pdf(data)
    if content_type == "docx":
        return _parse_docx(data)
    text = decode_text(data)
    if content_type == "html":
        return _parse_html(text)
    if content_type == "json":
        _check_json(text)
    elif content_type == "yaml":
        _check_yaml(text)
    return ParsedDocument(text=text, content_type=content_type, title=_guess_title(text, content_type, filename))


def decode_text(data: bytes) -> str:
    """Bytes to text, or LOAD_FAILED for binary or undecodable input."""
    for signature, description in _BINARY_SIGNATURES:
        if data.startswith(signature):
            raise KBError(ErrorCode.LOAD_FAILED, f"The content is {description}, not a supported document format")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16")
    elif b"\x00" in data[:8192]:
        raise KBError(ErrorCode.LOAD_FAILED, "The content is binary, not text; it cannot be ingested")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = _decode_legacy(data)
    if "\x00" in text or _control_ratio(text) > 0.05:
        raise KBError(ErrorCode.LOAD_FAILED, "The content is binary, not text; it cannot be ingested")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _decode_legacy(data: bytes) -> str:
    """Decode non-UTF-8 text. charset-normalizer guesses poorly on short Western text (it
    picks Baltic code pages for French), so Windows-1252 wins among near-equal candidates."""
    from charset_normalizer import from_bytes

    results = from_bytes(data[: 1024 * 1024])
    best = results.best()
    if best is None or best.encoding is None:
        raise KBError(ErrorCode.LOAD_FAILED, "The content is not text in any known encoding; it cannot be ingested")
    close = [match.encoding for match in results if match.chaos <= best.chaos + 0.1]
    encoding = "cp1252" if "cp1252" in close else best.encoding
    try:
        return data.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        raise KBError(ErrorCode.LOAD_FAILED, f"The content could not be decoded as {encoding}") from None


def _control_ratio(text: str) -> float:
    sample = text[:10000]
    if not sample:
        return 0.0
    controls = sum(1 for char in sample if ord(char) < 32 and char not in "\n\r\t\f\v")
    return controls / len(sample)


def _check_json(text: str) -> None:
    try:
        json.loads(text)
    except ValueError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"The content is not valid JSON: {exc}") from None


def _check_yaml(text: str) -> None:
    import yaml

    try:
        list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"The content is not valid YAML: {exc}") from None


def _guess_title(text: str, content_type: str, filename: str) -> str:
    if content_type == "markdown":
        match = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
        if match:
            return match.group(1).strip()[:500]
    return PurePosixPath(filename).name[:500] if filename else ""


def _parse_html(html: str) -> ParsedDocument:
    import trafilatura

    text = trafilatura.extract(
        html, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
    )
    if not text or not text.strip():
        text = trafilatura.html2txt(html) or ""
    if not text.strip():
        raise KBError(ErrorCode.LOAD_FAILED, "The HTML page has no readable text")
    found = trafilatura.extract_metadata(html)
    metadata: dict[str, Any] = {}
    title = ""
    if found is not None:
        title = found.title or ""
        if found.author:
            metadata["author"] = found.author
        if found.date:
            metadata["published"] = found.date
    if title:
        metadata["title"] = title
    return ParsedDocument(text=text.strip() + "\n", content_type="html", title=title[:500], metadata=metadata)


def _parse_pdf(data: bytes) -> ParsedDocument:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise KBError(ErrorCode.LOAD_FAILED, "The PDF is encrypted with a password")
        page_texts = [(page.extract_text() or "").replace("\r\n", "\n").strip() for page in reader.pages]
        info = reader.metadata
    except KBError:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types on malformed input
        raise KBError(ErrorCode.LOAD_FAILED, f"The PDF could not be read: {exc}") from None
    if not any(page_texts):
        raise KBError(ErrorCode.LOAD_FAILED, "The PDF has no extractable text (is it a scanned image?)")
    text, pages = _join_pages(page_texts)
    metadata: dict[str, Any] = {"page_count": len(page_texts)}
    title = ""
    if info is not None:
        title = (info.title or "").strip()
        if info.author:
            metadata["author"] = info.author.strip()
        metadata.update(
            _epoch_dates(
                creation_date=_safe_attr(info, "creation_date"), modification_date=_safe_attr(info, "modification_date")
            )
        )
    if title:
        metadata["title"] = title
    return ParsedDocument(text=text, content_type="pdf", title=title[:500], metadata=metadata, pages=pages)


def _safe_attr(info: Any, name: str) -> datetime | None:
    try:
        return getattr(info, name)
    except (ValueError, TypeError):  # malformed date strings in the PDF's info dictionary
        return None


def _join_pages(page_texts: list[str]) -> tuple[str, tuple[Page, ...]]:
    parts: list[str] = []
    pages = []
    offset = 0
    for number, page_text in enumerate(page_texts, start=1):
        if parts:
            parts.append("\n\n")
            offset += 2
        parts.append(page_text)
        if page_text:
            pages.append(Page(number=number, start=offset, end=offset + len(page_text)))
        offset += len(page_text)
    return "".join(parts) + "\n", tuple(pages)


def _parse_docx(data: bytes) -> ParsedDocument:
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - python-docx raises many types on malformed input
        raise KBError(ErrorCode.LOAD_FAILED, f"The DOCX file could not be read: {exc}") from None
    blocks = []
    for block in document.iter_inner_content():
        if isinstance(block, docx.text.paragraph.Paragraph):
            line = _docx_paragraph_markdown(block)
        else:
            line = "\n".join(" | ".join(cell.text.strip() for cell in row.cells) for row in block.rows)
        if line.strip():
            blocks.append(line)
    if not blocks:
        raise KBError(ErrorCode.LOAD_FAILED, "The DOCX file has no text")
    properties = document.core_properties
    metadata: dict[str, Any] = {}
    if properties.author:
        metadata["author"] = properties.author
    if properties.title:
        metadata["title"] = properties.title
    metadata.update(_epoch_dates(creation_date=properties.created, modification_date=properties.modified))
    return ParsedDocument(
        text="\n\n".join(blocks) + "\n",
        content_type="docx",
        title=(properties.title or "")[:500],
        metadata=metadata,
    )


def _docx_paragraph_markdown(paragraph: Any) -> str:
    style = (paragraph.style.name if paragraph.style is not None else "") or ""
    text = paragraph.text.strip()
    if style == "Title":
        return f"# {text}"
    heading = re.match(r"Heading (\d)", style)
    if heading:
        return f"{'#' * min(int(heading.group(1)) + 1, 6)} {text}"
    if style.startswith("List"):
        return f"- {text}"
    return text


def _epoch_dates(**dates: datetime | None) -> dict[str, float]:
    return {name: value.timestamp() for name, value in dates.items() if isinstance(value, datetime)}
