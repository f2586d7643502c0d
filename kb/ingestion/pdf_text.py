"""Text and metadata of a PDF, extracted in a child process that limits its own memory and CPU time.

What pypdf spends grows with what a PDF asks for, not with its size: a 16 KB file whose pages
share one content stream of a few MB takes minutes and hundreds of MB. So the web process runs
``python -m kb.ingestion.pdf_text --max-pages N --max-text-chars N --memory-bytes N --cpu-seconds N``,
writes the PDF on its stdin and reads one JSON object from its stdout, killing it past a wall-clock
timeout. The child caps its address space (RLIMIT_AS) and CPU time (RLIMIT_CPU, which also ends it if
the parent has gone) before parsing anything. It needs neither Django nor the rest of the project.

The JSON object is either the result, ``{"pages": [text, ...], "title", "author" (or null), "dates"}``, or
``{"failure": kind, "detail": text}`` with ``kind`` one of the ``FAILURE_*`` constants below.
"""

import io
import logging
from datetime import datetime
from typing import Any

from kb.ingestion.child_budget import FAILURE_OUT_OF_MEMORY, failure, serve

FAILURE_ENCRYPTED = "encrypted"
FAILURE_TOO_MANY_PAGES = "too_many_pages"
FAILURE_TOO_MUCH_TEXT = "too_much_text"
FAILURE_UNREADABLE = "unreadable"


def extract(data: bytes, *, max_pages: int, max_text_chars: int) -> dict[str, Any]:
    """Each page's text, the title, author and dates (seconds since the epoch); or a failure."""
    from pypdf import PdfReader  # here, so that the web process can import this module's constants cheaply

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return failure(FAILURE_ENCRYPTED)
        page_count = len(reader.pages)
        if page_count > max_pages:
            return failure(FAILURE_TOO_MANY_PAGES, str(page_count))
        page_texts = []
        text_chars = 0
        for page in reader.pages:
            page_texts.append((page.extract_text() or "").replace("\r\n", "\n").strip())
            text_chars += len(page_texts[-1])
            if text_chars > max_text_chars:
                return failure(FAILURE_TOO_MUCH_TEXT)
        info = reader.metadata
        title = str(info.title or "").strip() if info is not None else ""
        author = str(info.author).strip() if info is not None and info.author else None
        dates = _epoch_dates(info) if info is not None else {}
    except MemoryError:
        return failure(FAILURE_OUT_OF_MEMORY)
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types on malformed input
        return failure(FAILURE_UNREADABLE, str(exc))
    return {"pages": page_texts, "title": title, "author": author, "dates": dates}


def _epoch_dates(info: Any) -> dict[str, float]:
    dates = {}
    for name in ("creation_date", "modification_date"):
        try:  # malformed date strings in the PDF's info dictionary, or dates no clock can show (D:00010101)
            value = getattr(info, name)
            if isinstance(value, datetime):
                dates[name] = value.timestamp()
        except (ValueError, TypeError, OverflowError):
            continue
    return dates


def main() -> None:
    logging.disable(logging.WARNING)  # pypdf's warnings about malformed files would only cost time
    serve(extract, "Extract a PDF's text (read on stdin) as JSON on stdout.", options=("max_pages", "max_text_chars"))


if __name__ == "__main__":
    main()
