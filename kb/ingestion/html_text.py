"""Text and metadata of an HTML page, extracted by trafilatura within limits of memory and CPU time.

trafilatura and libxml2 spend more than linear time and memory on some pages well within the size
budgets: a table of 100 rows each spanning 100 rows and columns (3 KB) became 1.5 M characters in
7.6 s, adjacent bold runs joined for Markdown output (8,000 in one paragraph, 1.6 MB) took 56 s and
11.8 GB, an unparseable JSON-LD script of 128 KB 9 s. So every page is extracted by ``python -m
kb.ingestion.html_text --max-depth N --max-elements N --max-text-chars N --memory-bytes N
--cpu-seconds N``, which reads the page (UTF-8) on its stdin and writes one JSON object on its
stdout, as kb.ingestion.pdf_text does for PDFs (about 0.2 s of start-up per page).

The JSON object is either the result, ``{"text", "title", "author", "published"}`` (the last two
may be null), or ``{"failure": kind, "detail": text}`` with ``kind`` one of the ``FAILURE_*``
constants below.
"""

from typing import Any

from kb.ingestion.child_budget import FAILURE_OUT_OF_MEMORY, failure, serve

FAILURE_TOO_DEEP = "too_deep"
FAILURE_TOO_MANY_ELEMENTS = "too_many_elements"
FAILURE_NO_TEXT = "no_text"
FAILURE_TOO_MUCH_TEXT = "too_much_text"


def extract(html: str, *, max_depth: int, max_elements: int, max_text_chars: int) -> dict[str, Any]:
    """The page's main text as Markdown, its title, author and date; or a failure. Nesting and
    elements are checked on the tree first (libxml2 itself stops at 256 levels): main-content
    extraction costs time for every element, the more the deeper they nest."""
    import trafilatura
    from trafilatura.utils import load_html

    try:
        tree = load_html(html)
        if tree is not None and (refused := _shape_failure(tree, max_depth=max_depth, max_elements=max_elements)):
            return refused
        text = trafilatura.extract(
            html, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
        )
        if not text or not text.strip():
            text = trafilatura.html2txt(html) or ""
        if not text.strip():
            return failure(FAILURE_NO_TEXT)
        if len(text) > max_text_chars:
            return failure(FAILURE_TOO_MUCH_TEXT, str(len(text)))
        found = trafilatura.extract_metadata(html)
    except MemoryError:
        return failure(FAILURE_OUT_OF_MEMORY)
    if found is None:
        return {"text": text.strip() + "\n", "title": "", "author": None, "published": None}
    return {"text": text.strip() + "\n", "title": found.title or "", "author": found.author, "published": found.date}


def _shape_failure(tree: Any, *, max_depth: int, max_elements: int) -> dict[str, Any] | None:
    from lxml import etree

    depth = elements = 0
    for event, _ in etree.iterwalk(tree, events=("start", "end")):
        if event == "end":
            depth -= 1
            continue
        depth += 1
        elements += 1
        if depth > max_depth:
            return failure(FAILURE_TOO_DEEP)
        if elements > max_elements:
            return failure(FAILURE_TOO_MANY_ELEMENTS)
    return None


def _extract_bytes(page: bytes, **limits: int) -> dict[str, Any]:
    return extract(page.decode("utf-8", "surrogatepass"), **limits)


def main() -> None:
    serve(
        _extract_bytes,
        "Extract an HTML page's text (read on stdin, UTF-8) as JSON on stdout.",
        options=("max_depth", "max_elements", "max_text_chars"),
    )


if __name__ == "__main__":
    main()
