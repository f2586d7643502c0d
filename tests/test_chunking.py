"""Token-aware, structure-aware chunks with line ranges."""

import itertools

import pytest

from kb.errors import ErrorCode, KBError
from kb.ingestion import chunking
from kb.ingestion.chunking import ChunkSettings, chunk_text, count_tokens
from kb.ingestion.formats import Page, parse
from kb.ingestion.markdown_headings import markdown_headings
from tests.support.documents import PYTHON, RUST, make_docx


def lines_of(text: str, chunk) -> str:
    return "\n".join(text.split("\n")[chunk.line_start - 1 : chunk.line_end])


def test_markdown_is_split_at_headings_before_anything_else():
    sections = [f"## Topic {n}\n\n" + f"Sentence about topic {n} and its details. " * 12 for n in range(5)]
    text = "# Guide\n\n" + "\n\n".join(sections)
    chunks = chunk_text(text, content_type="markdown", settings=ChunkSettings(max_tokens=150, min_tokens=0))
    assert len(chunks) >= 5
    for chunk in chunks[1:]:
        assert chunk.content.startswith("## Topic"), chunk.content[:40]
    for chunk in chunks:
        assert chunk.token_count <= 150
        assert chunk.content in lines_of(text, chunk)


def test_code_is_split_at_its_definitions():
    chunks = chunk_text(PYTHON, content_type="python", settings=ChunkSettings(max_tokens=64, min_tokens=0))
    starts = [chunk.content.split("\n")[0] for chunk in chunks]
    assert any(line.startswith("def retry") for line in starts)
    assert any(line.startswith("class Backoff") for line in starts)
    for chunk in chunks:
        assert chunk.content in lines_of(PYTHON, chunk)
    rust = chunk_text(RUST, content_type="rust", settings=ChunkSettings(max_tokens=48, min_tokens=0))
    assert any(chunk.content.startswith("async fn handle_error") for chunk in rust)


def prose_chunks() -> list:
    """Six paragraphs of twenty sentences each, chunked at most 100 tokens long."""
    text = "\n\n".join(f"Paragraph {n}. " + "The quick brown fox jumps over the lazy dog. " * 20 for n in range(6))
    return chunk_text(text, content_type="plain_text", settings=ChunkSettings(max_tokens=100, min_tokens=0))


def test_prose_chunks_stay_within_max_tokens():
    chunks = prose_chunks()
    assert len(chunks) > 1 and all(chunk.token_count <= 100 for chunk in chunks)


def test_prose_is_never_cut_mid_sentence():
    chunks = prose_chunks()
    assert len(chunks) > 1 and all(chunk.content.rstrip().endswith(".") for chunk in chunks)


def test_chunks_are_numbered_in_order():
    chunks = prose_chunks()
    assert [chunk.index for chunk in chunks] == list(range(len(chunks)))


def test_small_chunks_are_joined_up_to_min_tokens():
    text = "# A\n\nshort.\n\n# B\n\nalso short.\n\n# C\n\n" + "A longer section with many words in it. " * 10
    merged = chunk_text(text, content_type="markdown", settings=ChunkSettings(max_tokens=200, min_tokens=50))
    separate = chunk_text(text, content_type="markdown", settings=ChunkSettings(max_tokens=30, min_tokens=0))
    assert len(merged) < len(separate)
    assert merged[0].content.startswith("# A") and "# B" in merged[0].content


def test_overlap_repeats_text_between_neighbours():
    text = " ".join(f"Sentence number {n} says something." for n in range(80))
    chunks = chunk_text(
        text, content_type="plain_text", settings=ChunkSettings(max_tokens=60, min_tokens=0, overlap_tokens=15)
    )
    assert len(chunks) > 2
    for first, second in itertools.pairwise(chunks):
        assert first.content[-20:] in second.content or second.content[:20] in first.content


def test_each_chunk_lies_within_one_page_it_records():
    page_one, page_two = "First page text. " * 5, "Second page text. " * 5
    text = page_one + "\n\n" + page_two
    pages = [Page(1, 0, len(page_one)), Page(2, len(page_one) + 2, len(text))]
    chunks = chunk_text(text, content_type="pdf", settings=ChunkSettings(max_tokens=512), pages=pages)
    assert [(chunk.page, chunk.line_start, chunk.line_end) for chunk in chunks] == [(1, 1, 1), (2, 3, 3)]


def test_token_counts_use_the_embedding_models_tokenizer_without_truncation():
    assert count_tokens("hello world") == 2
    assert count_tokens("word " * 1000) == 1000
    long = "The glider rides a thermal, 3.5 m/s up; then it glides on.\n" * 10_000  # counted in pieces
    assert count_tokens(long) == 10_000 * count_tokens("The glider rides a thermal, 3.5 m/s up; then it glides on.")


def test_a_count_with_a_limit_stops_soon_after_the_limit(monkeypatch):
    """A caller's 3.5 MB chunk was tokenized whole to be refused: 500 MB for the tokenizer's output."""
    encoded: list[int] = []
    whole = chunking.tokenizer()

    class Recording:
        def encode(self, text: str, **options):
            encoded.append(len(text))
            return whole.encode(text, **options)

    monkeypatch.setattr(chunking, "tokenizer", lambda: Recording())
    assert count_tokens("word " * 700_000, at_most=8192) > 8192
    assert sum(encoded) <= chunking.COUNT_PIECE_CHARS


HANDBOOK = """---
title: front matter is not a heading
---
# Handbook

Welcome to the handbook of the service.

## Install

```sh
# a comment in a fence, not a heading
pip install service
```

Linux
-----

Use the distribution's packages; they are kept current by the maintainers.

# Operate ##

Watch the queue depth.
"""


def test_each_chunk_knows_the_headings_of_the_section_it_starts_in():
    drafts = chunk_text(HANDBOOK, content_type="markdown", settings=ChunkSettings(max_tokens=16, min_tokens=0))
    path_of = {draft.content.splitlines()[0]: draft.heading_path for draft in drafts}
    assert path_of["# Handbook"] == ("Handbook",)
    assert path_of["```sh"] == ("Handbook", "Install")
    assert path_of["Linux"] == ("Handbook", "Linux")  # a setext heading replaces its sibling
    assert path_of["# Operate ##"] == ("Operate",)  # a higher heading closes the deeper ones
    assert all(draft.heading_path for draft in drafts if "front matter" not in draft.content)


@pytest.mark.parametrize(
    ("text", "titles"),
    [
        ("# Top\n\npara\f# fake\n\n## Sub\n", ["Top", "Sub"]),  # \f, U+0085, U+2028 do not end a line
        ("# Top\n\npara\x85# fake\npara\u2028# fake\n", ["Top"]),
        ("# Top\n\n<!--\n# commented out\n-->\n\n## Sub\n", ["Top", "Sub"]),
        ("# Top\n\n<div>\n# inside an HTML block\n</div>\n\n<!-- one line -->\n## Sub\n", ["Top", "Sub"]),
        # a fence is closed only by a fence line without an info string
        ("# Top\n\n```\ncode\n```python\n# a comment\n```\n\n## Later\n", ["Top", "Later"]),
        ("first line of a title\nand its second line\n===\n\ntext\n", ["first line of a title and its second line"]),
        ("---\n\n# A\n\ntext\n\n---\n\n# B\n", ["A", "B"]),  # thematic breaks, not front matter
        ("---\ntitle: x\n# a YAML comment\n---\n# Real\n", ["Real"]),
        ("Title\r\n=====\r\n\r\n## Sub\r\ntext\r\n", ["Title", "Sub"]),
    ],
    ids=[
        "form feed",
        "other line separators",
        "HTML comment",
        "HTML blocks",
        "fence info string",
        "setext lines",
        "thematic breaks",
        "front matter",
        "CRLF",
    ],
)
def test_only_markdown_headings_make_heading_paths(text, titles):
    assert [heading.title for heading in markdown_headings(text)] == titles


@pytest.mark.parametrize(
    "text",
    [
        "---\ntitle: x\n# yaml comment\n---\n\nbody\n\n# The title\n",
        "```sh\n# install the deps\n```\n\n# The title\n",
        "#\nJust a paragraph that is not a heading.\n\n# The title\n",
    ],
    ids=["front matter comment", "fenced comment", "empty heading"],
)
def test_a_markdown_title_is_its_first_level_one_heading(text):
    assert parse(text.encode(), content_type="markdown", filename="notes.md").title == "The title"


def test_only_a_docx_heading_style_makes_a_heading():
    body = ["# typed like a heading", "```", "- typed like a list", "Plain text after them."]
    data = make_docx(title="Manual", heading="1. Chapter one", paragraphs=body)
    parsed = parse(data, content_type="docx", filename="manual.docx")
    assert [heading.title for heading in markdown_headings(parsed.text)] == ["Manual", "1. Chapter one"]
    assert "\\# typed like a heading" in parsed.text and "Plain text after them." in parsed.text


def test_text_without_markdown_structure_has_no_heading_path():
    drafts = chunk_text("# not markdown\n\nplain words", content_type="plain_text", settings=ChunkSettings())
    assert [draft.heading_path for draft in drafts] == [()]


@pytest.mark.parametrize(
    ("content_type", "text"),
    [
        ("python", "x = " + "(" * 2_000 + "1" + ")" * 2_000 + "\n"),
        ("javascript", "f(" + "[" * 2_000 + "]" * 2_000 + ");\n"),
        ("python", "".join(" " * depth + "if x:\n" for depth in range(150)) + " " * 150 + "pass\n"),
        ("markdown", "".join("  " * depth + "- item\n" for depth in range(150))),
    ],
    ids=["parentheses", "brackets", "indented blocks", "nested lists"],
)
def test_text_nested_past_the_parse_depth_is_split_as_prose(content_type, text):
    # The syntax-tree splitters take time in the square of the depth (2,000 parentheses: 8.6 s).
    drafts = chunk_text(text, content_type=content_type, settings=ChunkSettings(max_tokens=32, min_tokens=0))
    prose = chunk_text(text, content_type="plain_text", settings=ChunkSettings(max_tokens=32, min_tokens=0))
    assert [draft.content for draft in drafts] == [draft.content for draft in prose]
    assert "".join("".join(draft.content for draft in drafts).split()) == "".join(text.split())  # chunks are trimmed


@pytest.mark.parametrize(
    "nested",
    [
        lambda depth: "(" * depth + ")" * depth,
        lambda depth: ")))" + "{" * depth + "}" * depth,  # closers with nothing open count for nothing
        lambda depth: "".join(" " * level + "x\n" for level in range(depth + 1)),
        lambda depth: "".join("\t" * level + "x\n" for level in range(depth + 1)),
        lambda depth: "> " * depth + "quoted\n",
    ],
    ids=["parentheses", "braces after closers", "spaces", "tabs", "quote markers"],
)
def test_the_depth_that_sends_text_to_the_prose_splitter_is_the_parse_depth(settings, nested):
    limit = settings.KB_PARSE_MAX_DEPTH
    assert not chunking._too_deep_to_walk(nested(limit))
    assert chunking._too_deep_to_walk(nested(limit + 1))


def test_code_as_deep_as_the_parse_depth_is_still_split_at_its_definitions(settings):
    deep = PYTHON + "\n\nvalue = " + "(" * settings.KB_PARSE_MAX_DEPTH + "1" + ")" * settings.KB_PARSE_MAX_DEPTH + "\n"
    chunks = chunk_text(deep, content_type="python", settings=ChunkSettings(max_tokens=64, min_tokens=0))
    starts = [chunk.content.split("\n")[0] for chunk in chunks]
    assert any(line.startswith("def retry") for line in starts)
    assert any(line.startswith("class Backoff") for line in starts)
    settings.KB_PARSE_MAX_DEPTH -= 1  # one level past it: split as prose, definitions or not
    prose = chunk_text(deep, content_type="python", settings=ChunkSettings(max_tokens=64, min_tokens=0))
    assert [c.content for c in prose] == [
        c.content
        for c in chunk_text(deep, content_type="plain_text", settings=ChunkSettings(max_tokens=64, min_tokens=0))
    ]


def test_long_text_reaches_the_splitter_in_windows_and_keeps_every_word(monkeypatch):
    # The splitters take time in more than the text's length times its chunk count: 1.7 M characters
    # in 128-token chunks took 35 s whole. Each window holds about 40 full chunks.
    given: list[int] = []
    real_splitter = chunking._splitter

    class Recording:
        def __init__(self, splitter):
            self.splitter = splitter

        def chunk_indices(self, text):
            given.append(len(text))
            return self.splitter.chunk_indices(text)

    monkeypatch.setattr(chunking, "_splitter", lambda *key: Recording(real_splitter(*key)))
    text = " ".join(f"word{n % 97} and more words without a single stop" for n in range(2_000))
    drafts = chunk_text(text, content_type="plain_text", settings=ChunkSettings(max_tokens=16, min_tokens=0))
    window = chunking.WINDOW_CHARS_PER_TOKEN * 16
    assert len(text) > 10 * window and len(given) > 10 and max(given) <= window
    assert sum(given) == len(text)
    assert all(draft.token_count <= 16 for draft in drafts)
    assert " ".join(draft.content for draft in drafts).split() == text.split()


@pytest.mark.parametrize(
    ("text", "first_window"),
    [
        ("a" * 60 + "\n\n" + "b" * 20 + "\n" + "c " * 20, "a" * 60 + "\n\n"),
        ("a" * 60 + "\n" + "b" * 20 + " " + "c" * 30, "a" * 60 + "\n"),
        ("a" * 60 + " " + "b" * 60, "a" * 60 + " "),
        ("a" * 49 + " " + "b" * 70, "a" * 49 + " " + "b" * 50),  # a space in the first half: cut hard
    ],
    ids=["blank line", "line break", "space", "none in the second half"],
)
def test_a_window_ends_at_the_best_boundary_in_its_second_half(text, first_window):
    windows = list(chunking._windows(text, 0, len(text), chars=100, tokens=100))
    assert text[slice(*windows[0])] == first_window
    assert "".join(text[start:end] for start, end in windows) == text
    assert all(0 < end - start <= 100 for start, end in windows)


def test_text_dense_in_tokens_gets_windows_of_as_many_tokens_not_characters():
    # Chinese is about a token a character: windows sized in characters held 200 chunks, not 40
    # (1 M characters took 50 s to chunk).
    text = "".join(chr(0x4E00 + (n * 7919) % 2000) for n in range(3_000))
    windows = list(chunking._windows(text, 0, len(text), chars=1_000, tokens=100))
    assert "".join(text[start:end] for start, end in windows) == text
    assert len(windows) >= 25 and all(count_tokens(text[start:end]) <= 100 for start, end in windows)
    drafts = chunk_text(text, content_type="plain_text", settings=ChunkSettings(max_tokens=16, min_tokens=0))
    assert "".join(draft.content for draft in drafts) == text and all(draft.token_count <= 16 for draft in drafts)


def test_text_of_few_tokens_per_character_is_counted_in_linear_time(monkeypatch):
    """A word of a million letters is one token, so small chunks could be joined across the whole
    text, counted again at every join (a 4.9 MB line took 115 s of CPU). A joined chunk is held to
    one window's characters, and the characters the tokenizer is given stay a few times the text's."""
    counted: list[int] = []

    def counting(text: str) -> int:
        counted.append(len(text))
        return count_tokens(text)

    monkeypatch.setattr(chunking, "count_tokens", counting)
    settings = ChunkSettings(max_tokens=16, min_tokens=8)
    window = chunking.WINDOW_CHARS_PER_TOKEN * settings.max_tokens
    text = "a" * (30 * window)
    drafts = chunk_text(text, content_type="plain_text", settings=settings)
    assert "".join(draft.content for draft in drafts) == text
    assert all(len(draft.content) <= window for draft in drafts)
    assert sum(counted) <= 4 * len(text)


def test_small_chunks_are_joined_as_before_when_words_are_ordinary():
    text = "\n\n".join(f"Section {n}. A short line." for n in range(40))
    drafts = chunk_text(text, content_type="plain_text", settings=ChunkSettings(max_tokens=64, min_tokens=20))
    assert " ".join(draft.content for draft in drafts).split() == text.split()
    assert all(draft.token_count <= 64 for draft in drafts)
    assert all(draft.token_count >= 20 for draft in drafts[:-1])


def test_a_long_text_waits_for_its_turn_to_be_split_no_longer_than_a_request_may_take(settings):
    settings.KB_INGEST_REQUEST_SECONDS = 1
    long_text = "Words of a long report. " * (chunking.LONG_TEXT_CHARS // 20)
    chunk_settings = ChunkSettings(max_tokens=256, min_tokens=0)
    held = 0
    while chunking._long_text_turns.acquire(blocking=False):  # every turn taken by another long text
        held += 1
    try:
        with pytest.raises(KBError) as error:
            chunk_text(long_text, content_type="plain_text", settings=chunk_settings)
        short = chunk_text("A short note.", content_type="plain_text", settings=chunk_settings)  # never waits
    finally:
        for _ in range(held):
            chunking._long_text_turns.release()
    assert held >= 1
    assert error.value.code == ErrorCode.LOAD_FAILED
    assert error.value.message == (
        "Splitting the text waited more than 1 s for other long texts to be split (KB_INGEST_REQUEST_SECONDS); "
        "try again"
    )
    assert [chunk.content for chunk in short] == ["A short note."]
    assert len(chunk_text(long_text, content_type="plain_text", settings=chunk_settings)) > 1  # its turn came
