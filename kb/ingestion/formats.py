"""Recognising a document's format and turning it into text.

The content type comes from, in order: the caller's override, the file extension, the MIME
type, then the bytes themselves. Binary input that is not a supported document format is
refused with a message that says what it looks like, never stored as garbage.

Parsing keeps to the budgets of config.settings ("Parsing budgets"): whatever a document asks
for (deep nesting, YAML aliases, ZIP entries that inflate a thousandfold, PDF pages that share a
huge content stream), it is refused with LOAD_FAILED naming the setting rather than costing
unbounded time or memory, or ending in a RecursionError.
"""

import io
import json
import logging
import math
import mimetypes
import re
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, islice
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

from django.conf import settings

from kb.embedding_providers import usable_cores
from kb.errors import ErrorCode, KBError
from kb.ingestion import docx_text, html_text, pdf_text
from kb.ingestion.archives import UNREADABLE_ZIP, bounded_entry_count, open_archive
from kb.ingestion.child_budget import FAILURE_OUT_OF_MEMORY
from kb.ingestion.markdown_headings import first_title
from kb.storable import storable_text

logger = logging.getLogger(__name__)

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
# JSON nesting is measured on the brackets outside strings, one match at a time (no recursion,
# no copy of the text). A string that never closes runs to the end of the text: were its closing
# quote required, every quote after it would start a scan to the end again (quadratic: 60,000
# escaped quotes held the web process for minutes).
_JSON_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
# How far each bracket takes the nesting (JSON here; source code in kb.ingestion.chunking).
BRACKET_STEPS = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}
# The parsing children (`python -m kb.ingestion.pdf_text`, `...html_text`) run from the directory that holds `kb`.
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Page:
    """A page of a paged format: its number and where its text lies in the document text."""

    number: int
    start: int
    end: int


# What a file says of itself (title, author) is kept this long: every search hit carries its
# document's metadata, and a 2 MB author in a DOCX made a 100-hit search answer 210 MB.
FILE_METADATA_MAX_CHARS = 500


@dataclass(frozen=True)
class ParsedDocument:
    text: str
    content_type: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    pages: tuple[Page, ...] = ()

    def __post_init__(self) -> None:
        # What a file says of itself is anybody's text: a PDF's Author holding a NUL (or a lone
        # surrogate) had failed the document's write with a database error at every door, and a
        # NUL in a PDF's text (a broken font encoding) was refused as if the caller had sent it.
        # Each becomes one U+FFFD, so pages keep their offsets.
        object.__setattr__(self, "text", storable_text(self.text, limit=len(self.text)))
        object.__setattr__(self, "title", storable_text(self.title, limit=FILE_METADATA_MAX_CHARS))
        object.__setattr__(self, "metadata", {key: _storable(value) for key, value in self.metadata.items()})


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value, limit=FILE_METADATA_MAX_CHARS)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
    if text_head.startswith((b"{", b"[")) and _is_json(data):
        return "json"
    if re.search(rb"^#{1,6} \S", head, re.MULTILINE) or re.search(rb"^```", head, re.MULTILINE):
        return "markdown"
    return "plain_text"


def _is_json(data: bytes) -> bool:
    """Valid JSON, or JSON too deeply nested to check (so that parsing refuses it by name)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    if _json_depth(text) > settings.KB_PARSE_MAX_DEPTH:
        return True
    try:
        _load_json(text)
    except ValueError:
        return False
    return True


def _is_docx(data: bytes) -> bool:
    entry_count = bounded_entry_count(data)
    if entry_count is not None and entry_count > settings.KB_ARCHIVE_MAX_ENTRIES:
        return False  # listing it would cost too much; it is then refused as a ZIP archive
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return "word/document.xml" in archive.namelist()
    except UNREADABLE_ZIP:
        return False


def parse(data: bytes, *, content_type: str, filename: str = "") -> ParsedDocument:
    """The document a file holds, or LOAD_FAILED (never another error: one file's failure must not
    stop the other files of an upload, a folder or a sync, as a ZIP directory zipfile could not
    list had stopped all of them)."""
    try:
        return _parse(data, content_type=content_type, filename=filename)
    except KBError:
        raise
    except Exception:  # a parser library's own failure on input nobody foresaw
        logger.exception("reading a %s file (%r) failed", content_type, filename)  # %r: a name may hold line breaks
        raise KBError(ErrorCode.LOAD_FAILED, f"The file could not be read as {content_type}") from None


def _parse(data: bytes, *, content_type: str, filename: str) -> ParsedDocument:
    if content_type == "pdf":
        return _parse_pdf(data)
    if content_type == "docx":
        return _parse_docx(data)
    # Checked on the bytes, before decoding: no character takes more than four bytes in UTF-8.
    if len(data) > 4 * settings.KB_MAX_TEXT_CHARS:
        raise _too_much_text(f"{len(data)} bytes")
    text = decode_text(data)
    if len(text) > settings.KB_MAX_TEXT_CHARS:
        raise _too_much_text(f"{len(text)} characters")
    if content_type == "html":
        return _parse_html(text)
    if content_type == "json":
        _check_json(text)
    elif content_type == "yaml":
        _check_yaml(text)
    return ParsedDocument(text=text, content_type=content_type, title=_guess_title(text, content_type, filename))


def _too_much_text(size: str) -> KBError:
    # LOAD_FAILED, as for the text of a PDF or DOCX over the same limit.
    return KBError(
        ErrorCode.LOAD_FAILED,
        f"The text is {size}; the limit is {settings.KB_MAX_TEXT_CHARS} characters (KB_MAX_TEXT_CHARS)",
    )


def decode_text(data: bytes) -> str:
    """Bytes to text, or LOAD_FAILED for binary or undecodable input."""
    for signature, description in _BINARY_SIGNATURES:
        if data.startswith(signature):
            raise KBError(ErrorCode.LOAD_FAILED, f"The content is {description}, not a supported document format")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError:
            raise KBError(ErrorCode.LOAD_FAILED, "The content starts as UTF-16 but is not valid UTF-16") from None
    elif b"\x00" in data[:8192]:
        raise KBError(ErrorCode.LOAD_FAILED, "The content is binary, not text; it cannot be ingested")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = _mostly_utf8(data) or _decode_legacy(data)
    if "\x00" in text or _control_ratio(text) > 0.05:
        raise KBError(ErrorCode.LOAD_FAILED, "The content is binary, not text; it cannot be ingested")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _mostly_utf8(data: bytes) -> str | None:
    """UTF-8 with a few bad bytes (a file cut and pasted together, one byte flipped), each shown
    as U+FFFD: a French page with one stray byte had been refused as no text at all, and other
    damage read as Cyrillic. Text in a legacy encoding has no valid multi-byte sequences to
    outnumber its invalid ones, so it still goes to the encoding guesser."""
    text = data.decode("utf-8-sig", "replace")
    replaced = text.count("\ufffd") - data.count("\ufffd".encode())
    valid = sum(1 for character in text if ord(character) > 127 and character != "\ufffd")
    return text if 0 < replaced * 10 <= valid else None


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


# Past this size JSON is checked for nesting only, not decoded: decoding builds a Python object per
# value, and a few megabytes of [[],[],...] weigh hundreds of megabytes.
JSON_DECODE_MAX_CHARS = 1_000_000


def _check_json(text: str) -> None:
    _check_nesting(_json_depth(text), "JSON")
    if len(text) > JSON_DECODE_MAX_CHARS:
        return
    try:
        _load_json(text)
    except ValueError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"The content is not valid JSON: {exc}") from None


def _json_depth(text: str) -> int:
    steps = (BRACKET_STEPS.get(match.group(), 0) for match in _JSON_STRING_OR_BRACKET.finditer(text))
    return max(accumulate(steps), default=0)


def _load_json(text: str) -> None:
    """Validate JSON; objects are dropped as soon as they are read, since only validity matters
    and objects are most of what decoded JSON weighs."""
    json.loads(text, object_pairs_hook=_drop)


def _drop(pairs: list[tuple[str, Any]]) -> None:
    return None


def _check_nesting(depth: int, kind: str) -> None:
    if depth > settings.KB_PARSE_MAX_DEPTH:
        raise _too_deep(kind)


def _too_deep(kind: str) -> KBError:
    return KBError(
        ErrorCode.LOAD_FAILED,
        f"The {kind} content nests deeper than {settings.KB_PARSE_MAX_DEPTH} levels (KB_PARSE_MAX_DEPTH)",
    )


def _check_yaml(text: str) -> None:
    """Valid YAML within the nesting and alias budgets. Only the parser's events are read (by
    libyaml when available): building the documents would cost over a hundred times the text."""
    import yaml

    try:
        _check_yaml_events(yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    except yaml.YAMLError as exc:
        raise KBError(ErrorCode.LOAD_FAILED, f"The content is not valid YAML: {exc}") from None


def _check_yaml_events(events: Iterable[Any]) -> None:
    """Nesting, and the nodes aliases would add if expanded, counted without expanding anything.

    An anchored node's size (its nodes, through aliases too) is known when it ends, and an alias
    adds that size, so a "billion laughs" is refused after a few lines. Undefined and duplicate
    anchors are refused as PyYAML's composer refuses them."""
    import yaml

    anchored: dict[str, int] = {}  # anchor -> nodes of the anchored node, in the current document
    open_collections: list[list[Any]] = []  # [anchor, nodes so far] of each open sequence or mapping
    alias_nodes = 0
    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            anchored = {}
            continue
        if isinstance(event, yaml.AliasEvent):
            nodes = _aliased_nodes(anchored, event)
            alias_nodes += nodes
            if alias_nodes > settings.KB_YAML_MAX_ALIAS_NODES:
                raise KBError(
                    ErrorCode.LOAD_FAILED,
                    f"The YAML content's aliases expand to more than {settings.KB_YAML_MAX_ALIAS_NODES} nodes "
                    "(KB_YAML_MAX_ALIAS_NODES)",
                )
        elif isinstance(event, yaml.CollectionStartEvent):
            _define_anchor(anchored, event)
            open_collections.append([event.anchor, 1])
            _check_nesting(len(open_collections), "YAML")
            continue
        elif isinstance(event, yaml.ScalarEvent):
            _define_anchor(anchored, event)
            nodes = 1
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, nodes = open_collections.pop()
            if anchor:
                anchored[anchor] = nodes
        else:
            continue
        if open_collections:
            open_collections[-1][1] += nodes


def _define_anchor(anchored: dict[str, int], event: Any) -> None:
    from yaml.composer import ComposerError

    if event.anchor in anchored:
        raise ComposerError(None, None, f"found duplicate anchor {event.anchor!r}", event.start_mark)
    if event.anchor:
        anchored[event.anchor] = 1  # a collection's true size is recorded when it ends


def _aliased_nodes(anchored: dict[str, int], event: Any) -> int:
    from yaml.composer import ComposerError

    if event.anchor not in anchored:
        raise ComposerError(None, None, f"found undefined alias {event.anchor!r}", event.start_mark)
    return anchored[event.anchor]


def _guess_title(text: str, content_type: str, filename: str) -> str:
    if content_type == "markdown" and (title := first_title(text)):
        return title
    return PurePosixPath(filename).name if filename else ""


def _parse_html(html: str) -> ParsedDocument:
    from trafilatura.utils import INVALID_XML_CHARS

    # trafilatura deletes these before libxml2 reads the page ("<\x01div" is a <div> to it): the
    # budgets are counted on the same text.
    html = INVALID_XML_CHARS.sub("", html)
    _check_html_tags(html)
    limits = {
        "max_depth": settings.KB_PARSE_MAX_DEPTH,
        "max_elements": settings.KB_HTML_MAX_ELEMENTS,
        "max_text_chars": settings.KB_MAX_TEXT_CHARS,
    }
    extracted = _extract_in_child(
        html_text, html.encode("utf-8", "surrogatepass"), limits, what="the HTML page", budgets="KB_HTML"
    )
    if failure := extracted.get("failure"):
        raise _html_failure(failure, extracted["detail"])
    title = extracted["title"]
    metadata: dict[str, Any] = {"author": extracted["author"], "published": extracted["published"], "title": title}
    metadata = {key: value for key, value in metadata.items() if value}
    return ParsedDocument(text=extracted["text"], content_type="html", title=title, metadata=metadata)


def _html_failure(failure: str, detail: str) -> KBError:
    failures = {
        html_text.FAILURE_TOO_DEEP: _too_deep("HTML"),
        html_text.FAILURE_TOO_MANY_ELEMENTS: _too_many_html_elements(),
        html_text.FAILURE_NO_TEXT: KBError(ErrorCode.LOAD_FAILED, "The HTML page has no readable text"),
        html_text.FAILURE_TOO_MUCH_TEXT: _too_much_text(f"{detail} characters"),
    }
    return failures.get(failure, KBError(ErrorCode.LOAD_FAILED, "The HTML page could not be read"))


# A start tag as HTML5 (and libxml2 2.14) tokenizes it: its name, then attributes, each a name and
# an optional value, quoted or not, up to the first ">" outside a quoted value (an end tag is read
# the same way). Possessive quantifiers: every text matches one way, so a scan takes time linear
# in the page.
_HTML_VALUE = r"""(?:"[^"]*+"|'[^']*+'|[^\t\n\f\r >]++)"""
_HTML_ATTRIBUTE = rf"[^\t\n\f\r />][^\t\n\f\r />=]*+(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+{_HTML_VALUE}?)?"
_HTML_TAG_BODY = rf"(?P<name>[A-Za-z][^\t\n\f\r />]*+)(?:[\t\n\f\r /]++|{_HTML_ATTRIBUTE})*+>?"
_HTML_START_TAG = re.compile(rf"<{_HTML_TAG_BODY}")
_HTML_ATTRIBUTES = re.compile(_HTML_ATTRIBUTE)
# Text and end tags (which build nothing: "</x ...>", and "</>") are passed over inside the regex
# engine; the group is where the next markup that builds a node starts: a comment, a doctype or
# other "<!" / "<?" declaration, a "</" that is not an end tag (a comment to the parser), a start tag.
_HTML_END_TAG = _HTML_TAG_BODY.replace("(?P<name>", "(?:")
_HTML_NEXT_MARKUP = re.compile(rf"(?:[^<]++|</{_HTML_END_TAG}|</>|<(?![!?/A-Za-z]))*+(<!--|<[!?]|</|<(?=[A-Za-z]))")
_HTML_COMMENT_END = re.compile(r"-?>|.*?--!?>", re.DOTALL)  # "<!-->" and "<!--->" end at once
# Elements whose content is text to the parser up to their own end tag (HTML5's raw text and
# escapable raw text, as libxml2 2.14 reads them); <plaintext> runs to the end of the page.
_HTML_TEXT_ONLY = {
    name: re.compile(rf"</{name}[\t\n\f\r />]", re.IGNORECASE)
    for name in ("script", "style", "title", "textarea", "xmp", "iframe", "noembed", "noframes")
}
# Attributes of one tag: the parser compares each with every other one of its tag.
MAX_TAG_ATTRIBUTES = 1_000


def _check_html_tags(html: str) -> None:
    """Counted on the text, so that a page over budget is refused before libxml2 builds it: 20 MB
    of <br> made a 716 MB tree, and one <div> with 20,000 attributes (200 KB) cost 3.5 s of
    parsing and extraction, 40,000 four times that. The page is read as its parser reads it:
    comments (nodes of the tree, counted as elements), declarations, end tags and the text of
    scripts, styles and the like hold no elements (a "<div" inside one is not counted). Where the
    parser's reading is uncertain the count takes the reading with more elements: a script that
    hides "</script" in an HTML comment ends later to the parser than here. The page reaches libxml2
    as text, so no <meta charset> can make it read "+ADw-" as "<" (UTF-7)."""
    # The parser adds <html>, <head> and <body> where the page leaves them out.
    elements_left, attributes_left = settings.KB_HTML_MAX_ELEMENTS - 3, settings.KB_HTML_MAX_ATTRIBUTES
    position = 0
    while markup := _HTML_NEXT_MARKUP.match(html, position):
        opening, position = markup.group(1), markup.end(1)
        elements_left -= 1  # an element, or a comment (a node of the tree too: 4 M "<!-->" made 645 MB)
        if elements_left < 0:
            raise _too_many_html_elements()
        if opening == "<!--":
            comment_end = _HTML_COMMENT_END.match(html, position)
            position = comment_end.end() if comment_end else len(html)
            continue
        if opening != "<":  # "<!x", "<?x" or "</1" up to the first ">": a comment to the parser
            declaration_end = html.find(">", position)
            position = len(html) if declaration_end < 0 else declaration_end + 1
            continue
        tag = _HTML_START_TAG.match(html, markup.start(1))
        tag_name = tag.group("name").lower()
        attributes = list(islice(_HTML_ATTRIBUTES.finditer(html, tag.end("name"), tag.end()), MAX_TAG_ATTRIBUTES + 1))
        if len(attributes) > MAX_TAG_ATTRIBUTES:
            raise KBError(ErrorCode.LOAD_FAILED, f"An HTML tag has more than {MAX_TAG_ATTRIBUTES} attributes")
        attributes_left -= len(attributes)
        if attributes_left < 0:
            raise KBError(
                ErrorCode.LOAD_FAILED,
                f"The HTML page has more than {settings.KB_HTML_MAX_ATTRIBUTES} attributes (KB_HTML_MAX_ATTRIBUTES)",
            )
        position = _past_text_only(html, tag, tag_name, attributes)


def _past_text_only(html: str, tag: re.Match, tag_name: str, attributes: list[re.Match]) -> int:
    """Where markup can start again after this start tag: past the text of a <script> and the like."""
    if tag.group().endswith("/>") and (not attributes or attributes[-1].end() < tag.end() - 1):
        return tag.end()  # libxml2 closes <script/> at once (HTML5 would not); in <script a=1/> "/" is a value's
    if tag_name == "plaintext":
        return len(html)
    if text_end_tag := _HTML_TEXT_ONLY.get(tag_name):
        text_end = text_end_tag.search(html, tag.end())
        return len(html) if text_end is None else text_end.start()
    return tag.end()


def _too_many_html_elements() -> KBError:
    return KBError(
        ErrorCode.LOAD_FAILED,
        f"The HTML page has more than {settings.KB_HTML_MAX_ELEMENTS} elements (KB_HTML_MAX_ELEMENTS)",
    )


def _parse_pdf(data: bytes) -> ParsedDocument:
    options = {"max_pages": settings.KB_PDF_MAX_PAGES, "max_text_chars": settings.KB_MAX_TEXT_CHARS}
    extracted = _extract_in_child(pdf_text, data, options, what="the PDF", budgets="KB_PDF")
    if failure := extracted.get("failure"):
        raise KBError(ErrorCode.LOAD_FAILED, _pdf_failure_message(failure, extracted["detail"]))
    page_texts: list[str] = extracted["pages"]
    if not any(page_texts):
        raise KBError(ErrorCode.LOAD_FAILED, "The PDF has no extractable text (is it a scanned image?)")
    text, pages = _join_pages(page_texts)
    metadata: dict[str, Any] = {"page_count": len(page_texts)}
    title = extracted["title"]
    if extracted["author"] is not None:
        metadata["author"] = extracted["author"]
    metadata.update(extracted["dates"])
    if title:
        metadata["title"] = title
    return ParsedDocument(text=text, content_type="pdf", title=title, metadata=metadata, pages=pages)


# Parsing children of this process at once: one a core. More would not read faster, only slow each
# other down (the wall-clock budget counts time spent waiting for a core: 2 of 10 DOCX files of
# 20 MB sent together, each 1.1 s alone, had run out of it) and add up their memory budgets.
_parsing_slots = threading.BoundedSemaphore(usable_cores())


def _extract_in_child(
    module: ModuleType, data: bytes, options: dict[str, int], *, what: str, budgets: str
) -> dict[str, Any]:
    """``module``'s result for ``data``, run as ``python -m module`` within the budgets named
    ``{budgets}_TIMEOUT_SECONDS`` (wall clock and CPU) and ``{budgets}_MAX_MEMORY_BYTES``."""
    timeout_setting, memory_setting = f"{budgets}_TIMEOUT_SECONDS", f"{budgets}_MAX_MEMORY_BYTES"
    timeout = getattr(settings, timeout_setting)
    command = [
        sys.executable,
        "-m",
        module.__name__,
        *(f"--{name.replace('_', '-')}={value}" for name, value in options.items()),
        f"--memory-bytes={getattr(settings, memory_setting)}",
        f"--cpu-seconds={timeout}",
    ]
    too_long = f"Reading {what} took more than {timeout} s ({timeout_setting})"
    if not _parsing_slots.acquire(timeout=timeout):
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"Reading {what} waited more than {timeout} s for the other files being read to finish; try again",
        )
    try:
        finished = subprocess.run(
            command, input=data, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=_PROJECT_ROOT, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise KBError(ErrorCode.LOAD_FAILED, too_long) from None
    finally:
        _parsing_slots.release()
    if finished.returncode == -signal.SIGXCPU:
        raise KBError(ErrorCode.LOAD_FAILED, too_long)
    try:
        answer = json.loads(finished.stdout)
    except ValueError:
        if finished.returncode > 0:  # an exception its reader did not expect: the file, not a budget
            message = (
                f"{what[0].upper()}{what[1:]} could not be read (its reader stopped with status {finished.returncode})"
            )
            raise KBError(ErrorCode.LOAD_FAILED, message) from None
        # Killed, or out of memory where it could not even say so.
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"Reading {what} failed within its budget ({memory_setting}, {timeout_setting}); "
            f"the parser ended with status {finished.returncode}",
        ) from None
    if answer.get("failure") == FAILURE_OUT_OF_MEMORY:
        message = (
            f"Reading {what} needed more than {getattr(settings, memory_setting)} bytes of memory ({memory_setting})"
        )
        raise KBError(ErrorCode.LOAD_FAILED, message)
    return answer


def _pdf_failure_message(failure: str, detail: str) -> str:
    return {
        pdf_text.FAILURE_ENCRYPTED: "The PDF is encrypted with a password",
        pdf_text.FAILURE_TOO_MANY_PAGES: f"The PDF has {detail} pages; the limit is {settings.KB_PDF_MAX_PAGES} "
        "(KB_PDF_MAX_PAGES)",
        pdf_text.FAILURE_TOO_MUCH_TEXT: f"The PDF's text is longer than {settings.KB_MAX_TEXT_CHARS} characters "
        "(KB_MAX_TEXT_CHARS)",
    }.get(failure, f"The PDF could not be read: {detail}")


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
    open_archive(data, kind="DOCX").close()  # its directory, held to the budgets before the child reads it
    options = {"max_text_chars": settings.KB_MAX_TEXT_CHARS}
    extracted = _extract_in_child(docx_text, data, options, what="the DOCX file", budgets="KB_DOCX")
    if extracted.get("failure"):
        raise KBError(ErrorCode.LOAD_FAILED, extracted["detail"])
    if not extracted["blocks"]:
        raise KBError(ErrorCode.LOAD_FAILED, "The DOCX file has no text")
    text = "\n\n".join(extracted["blocks"]) + "\n"
    if len(text) > settings.KB_MAX_TEXT_CHARS:  # the reader counts as it goes; this is the exact length
        raise _too_much_text(f"{len(text)} characters")
    title, author = extracted["title"], extracted["author"]
    metadata = {key: value for key, value in (("author", author), ("title", title)) if value} | extracted["dates"]
    return ParsedDocument(text=text, content_type="docx", title=title, metadata=metadata)
