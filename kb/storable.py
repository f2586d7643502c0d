"""What Postgres can store and our searches can use, checked once for every door.

Text columns cannot hold NUL characters, UTF-8 cannot encode lone surrogates, jsonb has no NaN
or Infinity, and integers past 64 bits overflow bigint columns (and, past 4,300 digits, Python's
own JSON encoder); a value nested without end would exhaust the stack of whatever walks it next.
Services call ``check_storable`` on everything a caller gave them before they write or query, so
the REST API, MCP and the admin give the same INVALID_ARGUMENT to the same input instead of a
database error.
"""

import json
import math
from typing import Any

from kb.errors import ErrorCode, KBError

MAX_NESTING = 32


def storable_text(text: str, *, limit: int) -> str:
    """Text from outside (a file's name, a message quoting it) as it can be stored and shown:
    file names may hold bytes that are not UTF-8 (lone surrogates to Python), which Postgres
    refuses, and may be very long."""
    try:
        data = text.encode("utf-8", "surrogateescape")  # a name's bytes again: shown as U+FFFD below
    except UnicodeEncodeError:  # a surrogate no decoding made
        data = text.encode("utf-8", "replace")
    return data.decode("utf-8", "replace").replace("\x00", "\ufffd")[:limit]


def parse_json(text: str) -> Any:
    """A caller's JSON text. Nesting past the parser's stack (RecursionError) is malformed JSON like
    any other: a ValueError, as json.JSONDecodeError and Python's 4,300-digit integer limit are."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def check_json_size(value: Any, *, what: str, limit: int, setting: str) -> None:
    """``value`` (already storable: check_storable) is at most ``limit`` characters as compact JSON."""
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    if size > limit:
        raise KBError(
            ErrorCode.INVALID_ARGUMENT, f"{what} is {size} characters as JSON; the limit is {limit} ({setting})"
        )


def check_storable(value: Any, *, what: str) -> None:
    problem = _problem(value, depth=0)
    if problem:
        raise KBError(ErrorCode.INVALID_ARGUMENT, f"{what}: {problem}")


def _problem(value: Any, *, depth: int) -> str | None:
    if depth > MAX_NESTING:
        return f"nested more than {MAX_NESTING} levels deep"
    if isinstance(value, str):
        return _text_problem(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite (no NaN or Infinity)"
    # Postgres keeps a JSON number as it was written: 1e19 comes back as a 20-digit integer, which
    # the next check of the same value (a re-ingest) would refuse; so floats get the same bounds.
    if isinstance(value, int | float) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return "numbers must lie between -2^63 and 2^63 (integers must fit in 64 bits)"
    if isinstance(value, dict):
        items: list[Any] = [item for pair in value.items() for item in pair]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        return None
    for item in items:
        if problem := _problem(item, depth=depth + 1):
            return problem
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text must not contain NUL characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text must be valid Unicode (no lone surrogates)"
    return None
