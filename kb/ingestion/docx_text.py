"""The text of a DOCX file, read as a stream in a child process that limits its own memory and CPU time.

python-docx builds the whole ``word/document.xml`` tree (about eight bytes of memory per byte of
XML) and resolved each paragraph's style by scanning every style, so a real 5 MB document cost
hundreds of MB and a million empty paragraphs took minutes. Here the XML is fed in chunks to an
lxml parser whose callbacks keep only the paragraph or table row being read, and give the text
python-docx gives: body paragraphs (runs and hyperlinks, tabs and breaks) as Markdown by their
style, tables row by row with merged cells repeated, and the core properties.

Streaming bounds the memory, not the time: the callbacks are Python, about 4 µs an element, so a
document of millions of short paragraphs within the archive budgets takes seconds of CPU, holding
the GIL of whichever process reads it (six million empty ones, 36 MB stored uncompressed: 25 s).
So the web process checks the archive's directory (kb.ingestion.archives) and then runs ``python
-m kb.ingestion.docx_text --max-text-chars N --memory-bytes N --cpu-seconds N`` as it does for
PDFs (kb.ingestion.pdf_text): the file on its stdin, one JSON object on its stdout, either the
result ``{"blocks": [...], "title", "author", "dates"}`` (dates in seconds since the epoch) or
``{"failure": kind, "detail": text}`` with ``kind`` one of the ``FAILURE_*`` names below or
``out_of_memory``. Neither this module nor the child needs Django.
"""

import io
import posixpath
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from lxml import etree

from kb.ingestion.child_budget import FAILURE_OUT_OF_MEMORY, failure, serve

FAILURE_UNREADABLE = "unreadable"

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_BODY, _P, _TBL, _TR, _TC = f"{_W}body", f"{_W}p", f"{_W}tbl", f"{_W}tr", f"{_W}tc"
_R, _T, _BR, _HYPERLINK = f"{_W}r", f"{_W}t", f"{_W}br", f"{_W}hyperlink"
_PPR, _PSTYLE, _TRPR, _TCPR = f"{_W}pPr", f"{_W}pStyle", f"{_W}trPr", f"{_W}tcPr"
_GRID_BEFORE, _GRID_SPAN, _VMERGE = f"{_W}gridBefore", f"{_W}gridSpan", f"{_W}vMerge"
_STYLE, _NAME, _VAL, _TYPE = f"{_W}style", f"{_W}name", f"{_W}val", f"{_W}type"
# What the other run children stand for in python-docx's Run.text (w:br depends on its type).
_RUN_TEXT = {f"{_W}tab": "\t", f"{_W}ptab": "\t", f"{_W}cr": "\n", f"{_W}noBreakHyphen": "-"}
_RUN_PATHS = ((_R,), (_HYPERLINK, _R))  # runs that count, below their paragraph
_ROW_PATH = [_BODY, _TBL, _TR]
_CELL_PATH = [_BODY, _TBL, _TR, _TC]
# Word tables have at most 63 columns; a larger span is malformed and would repeat a cell endlessly.
_MAX_GRID_SPAN = 64
# Styles kept from styles.xml, and the longest id and name kept: Word's own documents hold a few
# hundred styles with short ids and names; a part of millions would otherwise be held in memory.
_MAX_STYLES = 10_000
_MAX_STYLE_CHARS = 200
# python-docx shows these built-in styles by their user-interface names.
_UI_STYLE_NAMES = {"caption": "Caption", "footer": "Footer", "header": "Header"} | {
    f"heading {level}": f"Heading {level}" for level in range(1, 10)
}
_CORE_PROPERTIES = {
    "{http://purl.org/dc/elements/1.1/}title": "title",
    "{http://purl.org/dc/elements/1.1/}creator": "author",
    "{http://purl.org/dc/terms/}created": "created",
    "{http://purl.org/dc/terms/}modified": "modified",
}
# More than the web process keeps of a title or author (formats.FILE_METADATA_MAX_CHARS) or any date needs.
_MAX_PROPERTY_CHARS = 1_000
_RELATIONSHIP = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"
_W3CDTF_OFFSET = re.compile(r"([+-])(\d\d):(\d\d)")
_HEADING_STYLE = re.compile(r"Heading (\d)")
# What starts a Markdown block at a line's start: ATX headings, fences, quotes, HTML, list items,
# ordered ones (escaped at their dot), setext underlines and thematic breaks.
_BLOCK_MARKER = re.compile(
    r"^([ \t]*)(#|`{3}|~{3}|>|<(?=[A-Za-z/!?])|[-+*](?=[ \t]|$)|[=\-*_](?=[=\-*_ \t]*$))"
    r"|^([ \t]*\d{1,9})([.)])(?=[ \t]|$)",
    re.MULTILINE,
)
_READ_CHUNK_BYTES = 64 * 1024
# Malformed XML, a missing part, a bad CRC or deflate stream, a part cut short, an encrypted part
# or an unknown compression method.
_MALFORMED = (
    etree.LxmlError,
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    KeyError,
    ValueError,
    OSError,
    RuntimeError,
    NotImplementedError,
)


class _Unreadable(Exception):
    """The file is malformed or over a budget; the message says which, for the caller."""


def extract(data: bytes, *, max_text_chars: int) -> dict[str, Any]:
    """The blocks (paragraphs as Markdown, tables as ``a | b`` lines), title, author and dates;
    or a failure. The caller has held the archive's directory to the budgets (open_archive)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return _read_package(archive, max_text_chars)
    except _Unreadable as exc:
        return failure(FAILURE_UNREADABLE, str(exc))
    except MemoryError:
        return failure(FAILURE_OUT_OF_MEMORY)
    except _MALFORMED as exc:
        if isinstance(exc, etree.LxmlError) and "Memory allocation failed" in str(exc):  # libxml2's own
            return failure(FAILURE_OUT_OF_MEMORY)
        return failure(FAILURE_UNREADABLE, f"The DOCX file could not be read: {exc}")


def _read_package(archive: zipfile.ZipFile, max_text_chars: int) -> dict[str, Any]:
    package_parts = _related_parts(archive, "", kinds=("officeDocument", "core-properties"))
    document_name = package_parts.get("officeDocument")
    if document_name is None:
        raise _Unreadable("The DOCX file could not be read: it has no main document part")
    style_names = _StyleNames()
    styles_name = _related_parts(archive, document_name, kinds=("styles",)).get("styles")
    if _holds(archive, styles_name):  # styles and properties are optional: Word reads a file without them
        _feed(archive, styles_name, style_names)
    body = _Body(style_names, max_text_chars)
    _feed(archive, document_name, body)
    properties = _CoreProperties()
    core_name = package_parts.get("core-properties")
    if _holds(archive, core_name):
        _feed(archive, core_name, properties)
    dates = {
        name: parsed.timestamp()
        for name, key in (("creation_date", "created"), ("modification_date", "modified"))
        if (parsed := _w3cdtf_datetime(properties.values.get(key)))
    }
    return {
        "blocks": body.blocks,
        "title": properties.values.get("title", ""),
        "author": properties.values.get("author", ""),
        "dates": dates,
    }


def _holds(archive: zipfile.ZipFile, name: str | None) -> bool:
    try:
        return name is not None and archive.getinfo(name) is not None
    except KeyError:
        return False


def _feed(archive: zipfile.ZipFile, name: str, target: "_PartHandler") -> None:
    # No DTD (see _PartHandler.doctype), no entity expansion, no network: OOXML needs none of them.
    parser = etree.XMLParser(target=target, resolve_entities=False, no_network=True)
    for chunk in _read_chunks(archive, name):
        parser.feed(chunk)
    parser.close()


def _read_chunks(archive: zipfile.ZipFile, name: str) -> Iterator[bytes]:
    """A part's bytes in chunks. zipfile stops each part at the size its directory entry declares
    (failing the CRC check if the part holds more), and the web process held those sizes to the
    budgets (open_archive) before it ran this one, so a directory that understates a part cannot
    make it cost more."""
    with archive.open(name) as part:
        while chunk := part.read(_READ_CHUNK_BYTES):
            yield chunk


def _related_parts(archive: zipfile.ZipFile, source_name: str, *, kinds: tuple[str, ...]) -> dict[str, str]:
    """The first internal relationship target of each of these kinds (the last word of its type)
    from a part ("" for the package)."""
    directory, base = posixpath.split(source_name)
    rels_name = posixpath.join(directory, "_rels", f"{base}.rels")
    if not _holds(archive, rels_name):
        return {}
    relationships = _Relationships(kinds)
    _feed(archive, rels_name, relationships)
    parts: dict[str, str] = {}
    for kind, target in relationships.targets.items():
        resolved = target.lstrip("/") if target.startswith("/") else posixpath.join(directory, target)
        parts[kind] = posixpath.normpath(resolved)
    return parts


class _PartHandler:
    """lxml parser-target callbacks for one part; by default ignoring everything but a DTD."""

    def doctype(self, name: str, public_id: str | None, system_id: str | None) -> None:
        # Office documents never declare a DTD; one could only be there to define entities.
        raise _Unreadable("The DOCX file could not be read: a part declares a DTD")

    def start(self, tag: str, attrib: Any) -> None:
        pass

    def end(self, tag: str) -> None:
        pass

    def data(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Relationships(_PartHandler):
    """Keeps only the first target of each kind asked for: a part may hold millions."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self.targets: dict[str, str] = {}

    def start(self, tag: str, attrib: Any) -> None:
        if tag == _RELATIONSHIP and attrib.get("TargetMode") != "External":
            kind = attrib.get("Type", "").rsplit("/", 1)[-1]
            if kind in self.kinds and kind not in self.targets:
                self.targets[kind] = attrib.get("Target", "")


class _StyleNames(_PartHandler):
    """Paragraph style names by style id, and the default one, resolved as python-docx does."""

    def __init__(self) -> None:
        self._styles: dict[str, tuple[str | None, str]] = {}  # id -> (type, name); the first id wins
        self._default = ""
        self._style: dict[str, Any] | None = None

    def name_of(self, style_id: str | None) -> str:
        style_type, name = self._styles.get(style_id or "", (None, ""))
        return name if style_type == "paragraph" else self._default

    def start(self, tag: str, attrib: Any) -> None:
        if tag == _STYLE:
            self._style = {"id": attrib.get(f"{_W}styleId"), "type": attrib.get(_TYPE), "name": None}
            self._style["default"] = attrib.get(f"{_W}default") in ("1", "true", "on")
        elif tag == _NAME and self._style is not None and self._style["name"] is None:
            name = (attrib.get(_VAL) or "")[:_MAX_STYLE_CHARS]
            self._style["name"] = _UI_STYLE_NAMES.get(name, name)

    def end(self, tag: str) -> None:
        if tag != _STYLE or self._style is None:
            return
        style, self._style = self._style, None
        name = style["name"] or ""
        if style["id"] is not None and len(style["id"]) <= _MAX_STYLE_CHARS and len(self._styles) < _MAX_STYLES:
            self._styles.setdefault(style["id"], (style["type"], name))
        if style["type"] == "paragraph" and style["default"]:
            self._default = name  # the last default wins, as the specification says


class _CoreProperties(_PartHandler):
    """The first title, author and dates, each up to _MAX_PROPERTY_CHARS: a value arrives in as
    many pieces as it has entities, and joining it anew for each (a 3.3 KB title of 100,000
    "&amp;") took 11 s."""

    def __init__(self) -> None:
        self._pieces: dict[str, list[str]] = {}
        self._chars: dict[str, int] = {}
        self._reading: str | None = None
        self._depth = 0

    @property
    def values(self) -> dict[str, str]:
        return {name: "".join(pieces) for name, pieces in self._pieces.items()}

    def start(self, tag: str, attrib: Any) -> None:
        self._depth += 1
        name = _CORE_PROPERTIES.get(tag)
        if self._depth == 2 and name and name not in self._pieces:
            self._reading = name
            self._pieces[name], self._chars[name] = [], 0

    def end(self, tag: str) -> None:
        self._depth -= 1
        self._reading = None

    def data(self, text: str) -> None:
        if self._reading and (room := _MAX_PROPERTY_CHARS - self._chars[self._reading]) > 0:
            self._pieces[self._reading].append(text[:room])
            self._chars[self._reading] += min(len(text), room)


@dataclass
class _Cell:
    offset: int
    span: int = 1
    continues_above: bool = False
    paragraphs: list[str] = field(default_factory=list)


class _Body(_PartHandler):
    """Paragraphs and tables of ``w:body`` in document order, keeping only the block being read.

    As in python-docx, only direct children of the body are blocks (content inside revision marks or
    content controls is skipped), a table cell's text is its own paragraphs (not nested tables), a
    horizontally merged cell is repeated once per grid column, and a vertically merged one repeats
    the cell above it. Every character of the resulting text counts towards ``max_text_chars``, so
    repeated cells cannot multiply a small document into a huge text.
    """

    def __init__(self, style_names: _StyleNames, max_text_chars: int) -> None:
        self.blocks: list[str] = []
        self._style_names = style_names
        self._max_text_chars = max_text_chars
        self._text_chars = 0
        self._path: list[str] = [""]  # open elements, below a sentinel standing for the document's parent
        self._paragraph: list[str] | None = None
        self._paragraph_depth = 0
        self._style_id: str | None = None
        self._in_text = False
        self._table: list[str] | None = None
        self._row: list[_Cell] = []
        self._grid_before = 0
        self._cells_above: dict[int, tuple[str, int]] = {}  # grid offset -> (text, span) in the row above

    def start(self, tag: str, attrib: Any) -> None:
        path = self._path
        path.append(tag)
        if self._paragraph is not None:
            self._start_in_paragraph(tag, attrib)
        elif tag == _P and (path[-2] == _BODY or path[-5:-1] == _CELL_PATH):
            self._paragraph, self._paragraph_depth, self._style_id = [], len(path), None
        elif tag == _TBL and path[-2] == _BODY:
            self._table, self._cells_above = [], {}
        elif path[-3:] == _ROW_PATH:
            self._row, self._grid_before = [], 0
        elif path[-4:] == _CELL_PATH:
            offset = self._row[-1].offset + self._row[-1].span if self._row else self._grid_before
            self._row.append(_Cell(offset=offset))
        elif path[-5:] == [*_ROW_PATH, _TRPR, _GRID_BEFORE]:
            self._grid_before = _int_value(attrib, default=0)
        elif path[-6:-1] == [*_CELL_PATH, _TCPR] and self._row:
            if tag == _GRID_SPAN:
                self._row[-1].span = min(max(_int_value(attrib, default=1), 1), _MAX_GRID_SPAN)
            elif tag == _VMERGE:
                self._row[-1].continues_above = attrib.get(_VAL, "continue") == "continue"

    def _start_in_paragraph(self, tag: str, attrib: Any) -> None:
        if len(self._path) - self._paragraph_depth > 3:
            # What counts lies at most three levels below (w:hyperlink/w:r/w:t); copying the path
            # below for every element took 20 s for 140,000 nested ones (2.5 KB).
            return
        below = tuple(self._path[self._paragraph_depth :])
        if below == (_PPR, _PSTYLE):
            self._style_id = attrib.get(_VAL)
        elif below[:-1] in _RUN_PATHS:
            if tag == _T:
                self._in_text = True
            elif tag == _BR:
                self._add_text("\n" if attrib.get(_TYPE, "textWrapping") == "textWrapping" else "")
            elif tag in _RUN_TEXT:
                self._add_text(_RUN_TEXT[tag])

    def data(self, text: str) -> None:
        if self._in_text:
            self._add_text(text)

    def _add_text(self, text: str) -> None:
        if self._table is None:  # a cell's text is counted when its row is built
            self._count(len(text))
        assert self._paragraph is not None
        self._paragraph.append(text)

    def _count(self, chars: int) -> None:
        self._text_chars += chars
        if self._text_chars > self._max_text_chars:
            raise _Unreadable(
                f"The DOCX file's text is longer than {self._max_text_chars} characters (KB_MAX_TEXT_CHARS)"
            )

    def end(self, tag: str) -> None:
        self._in_text = False
        path = self._path
        if self._paragraph is not None and len(path) == self._paragraph_depth:
            self._end_paragraph()
        elif path[-3:] == _ROW_PATH:
            self._end_row()
        elif self._table is not None and tag == _TBL and path[-2] == _BODY:
            self._add_block("\n".join(self._table))
            self._table = None
        path.pop()

    def _end_paragraph(self) -> None:
        text = "".join(self._paragraph or ())
        self._paragraph = None
        if self._table is None:
            line = _paragraph_markdown(self._style_names.name_of(self._style_id), text.strip())
            if line.strip():  # its markup and the blank line after it count too (the text already did)
                self._count(max(0, len(line) - len(text)) + len("\n\n"))
            self._add_block(line)
        elif self._row:
            self._row[-1].paragraphs.append(text)

    def _end_row(self) -> None:
        cells: list[str] = []
        below: dict[int, tuple[str, int]] = {}
        for cell in self._row:
            own = ("\n".join(cell.paragraphs), cell.span)
            text, span = self._cells_above.get(cell.offset, own) if cell.continues_above else own
            below[cell.offset] = (text, span)
            shown = _literal(text.strip())
            # Each copy with the " | " (or line break) after it: empty cells spanning 64 columns had
            # made 288 million characters of separators from a 1 MB file.
            self._count((len(shown) + len(" | ")) * span)
            cells.extend([shown] * span)
        if self._table is not None:
            self._table.append(" | ".join(cells))
        self._cells_above, self._row = below, []

    def _add_block(self, line: str) -> None:
        if line.strip():
            self.blocks.append(line)


def _paragraph_markdown(style: str, text: str) -> str:
    heading = _HEADING_STYLE.match(style)
    if style == "Title":
        prefix = "# "
    elif heading:
        prefix = "#" * min(int(heading.group(1)) + 1, 6) + " "
    elif style.startswith("List"):
        prefix = "- "
    else:
        return _literal(text)
    # After its marker the first line is the heading's or item's own text ("1. Introduction" stays so).
    first, newline, rest = text.partition("\n")
    return prefix + first + newline + _literal(rest)


def _literal(text: str) -> str:
    """``text`` with what would start a Markdown block at a line's start escaped: only the document's
    heading styles make headings ("# not a heading" typed in a Normal paragraph stays text)."""

    def escaped(marker: re.Match[str]) -> str:
        lead, sign = marker.group(1, 2) if marker.group(2) else marker.group(3, 4)
        return f"{lead}\\{sign}"

    return _BLOCK_MARKER.sub(escaped, text)


def _int_value(attrib: Any, *, default: int) -> int:
    try:
        return int(attrib.get(_VAL, default))
    except ValueError:
        return default


def _w3cdtf_datetime(text: str | None) -> datetime | None:
    """A core-properties date as python-docx reads it: a date, or a time with an optional UTC offset."""
    if not text:
        return None
    parsed = None
    for template in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d", "%Y-%m", "%Y"):
        try:
            parsed = datetime.strptime(text[:19], template)
        except ValueError:
            continue
    offset = text[19:]
    if parsed is None or (len(offset) == 6 and not _W3CDTF_OFFSET.match(offset)):
        return None
    if len(offset) == 6:
        sign, hours, minutes = offset[0], int(offset[1:3]), int(offset[4:6])
        try:
            parsed -= (1 if sign == "+" else -1) * timedelta(hours=hours, minutes=minutes)
        except OverflowError:  # 0001-01-01T00:00:00+01:00, 9999-12-31T23:59:59-01:00: no such date
            return None
    return parsed.replace(tzinfo=UTC)


def main() -> None:
    serve(extract, "Extract a DOCX file's text (read on stdin) as JSON on stdout.", options=("max_text_chars",))


if __name__ == "__main__":
    main()
