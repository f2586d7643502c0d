"""The headings of Markdown text, where they start, by the rules of CommonMark's block structure.

Written here rather than taken from a Markdown parser because it must cost little on any input: one
pass over the lines, no token per block. markdown-it-py's block parser took 25-44 s and a Python
object per block for 5 MB of one-line list items or headings (the longest text we accept). What
is not a heading although it looks like one: lines in code fences, in HTML blocks (a commented-out
``<!-- # Title -->``) and in YAML front matter. A setext heading's text is its whole paragraph.
Lines end only at ``\\n`` (``\\r\\n`` too), as in the line ranges of chunks: a form feed or U+2028
inside a line does not start a new one. Headings inside lists and block quotes are not tracked.
"""

import re
from dataclasses import dataclass

MAX_HEADING_CHARS = 200

_ATX_OPENING = re.compile(r" {0,3}(#{1,6})(?:[ \t]|$)")
_SETEXT_UNDERLINE = re.compile(r" {0,3}(=+|-+)[ \t]*$")
# An opening fence; a backtick fence's info string holds no backtick.
_FENCE_OPENING = re.compile(r" {0,3}(?:(`{3,})[^`]*|(~{3,}).*)$")
_FENCE_CLOSING = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*$")
_THEMATIC_BREAK = re.compile(r" {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
# Lines that start a block a paragraph does not continue into: list items, quotes, tables.
_OTHER_BLOCK = re.compile(r" {0,3}(?:[-*+>|]|\d{1,9}[.)])(?:[ \t]|$)")
_INDENTED = re.compile(r"(?: {4}|\t)")
# HTML blocks (CommonMark 4.6) of kinds 1-5 end at a line holding their closing marker, kind 6 at
# a blank line. (Kind 7, any other tag alone on a line, is rare before a heading and not tracked.)
_HTML_CLOSED_BY = [
    (
        re.compile(r" {0,3}<(?:pre|script|style|textarea)(?:[ \t>]|$)", re.IGNORECASE),
        re.compile(r"</(?:pre|script|style|textarea)>", re.IGNORECASE),
    ),
    (re.compile(r" {0,3}<!--"), re.compile(r"-->")),
    (re.compile(r" {0,3}<\?"), re.compile(r"\?>")),
    (re.compile(r" {0,3}<![A-Za-z]"), re.compile(r">")),
    (re.compile(r" {0,3}<!\[CDATA\["), re.compile(r"\]\]>")),
]
_HTML_TO_BLANK_LINE = re.compile(
    r" {0,3}</?(?:address|article|aside|base|basefont|blockquote|body|caption|center|col|colgroup|dd|details|"
    r"dialog|dir|div|dl|dt|fieldset|figcaption|figure|footer|form|frame|frameset|h[1-6]|head|header|hr|html|"
    r"iframe|legend|li|link|main|menu|menuitem|nav|noframes|ol|optgroup|option|p|param|search|section|summary|"
    r"table|tbody|td|tfoot|th|thead|title|tr|track|ul)(?:[ \t>]|/>|$)",
    re.IGNORECASE,
)
_UNTIL_BLANK_LINE = re.compile(r"\A\Z")  # the end marker of kind 6: checked on blank lines only
# Front matter: a block between two "---" lines at the very start whose first entry is a YAML key
# (a document that merely opens with a thematic break keeps its headings).
_FRONT_MATTER = re.compile(
    r"\A---[ \t]*\r?\n(?:[ \t]*(?:#[^\n]*)?\r?\n)*[ \t]*[\w\"'][^\n:]*:(?:[ \t]|\r?\n|$).*?^---[ \t]*\r?$",
    re.DOTALL | re.MULTILINE,
)


@dataclass(frozen=True)
class Heading:
    offset: int  # where the heading's first line starts in the text
    level: int
    title: str  # its text on one line, at most MAX_HEADING_CHARS; "" for an empty "#"


def markdown_headings(text: str) -> list[Heading]:
    """Every heading of ``text`` in order."""
    headings: list[Heading] = []
    front_matter = _FRONT_MATTER.match(text)
    offset = front_matter.end() if front_matter else 0
    fence: str | None = None  # the fence that opened the code block we are in
    html_end: re.Pattern[str] | None = None  # the end marker of the HTML block we are in
    paragraph: tuple[int, list[str]] | None = None  # the open paragraph: where it starts, its lines
    lines = text[offset:].split("\n")
    for line in lines:
        start, offset = offset, offset + len(line) + 1
        line = line.removesuffix("\r")
        blank = not line.strip()
        if fence is not None:
            closing = _FENCE_CLOSING.match(line)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence):
                fence = None
            continue
        if html_end is not None:
            if blank if html_end is _UNTIL_BLANK_LINE else html_end.search(line):
                html_end = None
            continue
        if blank:
            paragraph = None
            continue
        if paragraph is not None and (setext := _SETEXT_UNDERLINE.match(line)):
            headings.append(_heading(paragraph[0], 1 if setext.group(1)[0] == "=" else 2, " ".join(paragraph[1])))
            paragraph = None
            continue
        if paragraph is not None and _INDENTED.match(line):  # indented code cannot interrupt a paragraph
            paragraph[1].append(line)
            continue
        block = _block_start(line)
        if block is None:
            if paragraph is None and not _INDENTED.match(line):
                paragraph = (start, [line])
            elif paragraph is not None:
                paragraph[1].append(line)
            continue
        paragraph = None
        kind, value = block
        if kind == "heading":
            headings.append(_heading(start, *value))
        elif kind == "fence":
            fence = value
        elif kind == "html":
            html_end = value
    return headings


def _block_start(line: str) -> tuple[str, object] | None:
    """What block ``line`` opens, if it opens one that ends a paragraph."""
    if atx := _ATX_OPENING.match(line):
        return "heading", (len(atx.group(1)), _atx_title(line[atx.end() :]))
    if fence := _FENCE_OPENING.match(line):
        return "fence", fence.group(1) or fence.group(2)
    for opening, closing in _HTML_CLOSED_BY:
        if opened := opening.match(line):
            return "html", None if closing.search(line, opened.end()) else closing
    if _HTML_TO_BLANK_LINE.match(line):
        return "html", _UNTIL_BLANK_LINE
    if _THEMATIC_BREAK.match(line) or _OTHER_BLOCK.match(line):
        return "other", None
    return None


def _heading(offset: int, level: int, title: str) -> Heading:
    return Heading(offset=offset, level=level, title=" ".join(title.split())[:MAX_HEADING_CHARS])


def _atx_title(rest: str) -> str:
    """An ATX heading's text without its optional closing hashes ("Title ##"), in linear time (a
    regular expression for it backtracks quadratically on a long run of spaces)."""
    title = rest.strip(" \t")
    unhashed = title.rstrip("#")
    if not unhashed or unhashed[-1] in " \t":
        title = unhashed.rstrip(" \t")
    return title


def first_title(text: str) -> str:
    """The text of the first non-empty level-1 heading, or ""."""
    return next((heading.title for heading in markdown_headings(text) if heading.level == 1 and heading.title), "")
