"""The response-size budget (MCP_MAX_RESPONSE_CHARS): long texts are cut, visibly, rather than
failing the call or flooding the model's context.

The budget counts the characters of the result serialised as compact JSON. Texts are cut
longest first (every text above a common length is cut to it), so short chunks stay whole.
"""

import json
from collections.abc import Sequence
from typing import Any

from django.conf import settings

TextField = tuple[dict[str, Any], str]  # a dict holding a text, and the key of that text


def json_size(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False, default=str))


def truncation_note(cut: int) -> str:
    return f" … [{cut} more characters truncated]"


def fit_texts(payload: Any, fields: Sequence[TextField], budget: int | None = None) -> list[TextField]:
    """Cut the texts at ``fields`` (in place) so that ``payload`` fits; returns the fields that were cut.

    If the payload is too large even with every text cut to nothing, they are left cut to
    nothing and the caller decides what else to drop.
    """
    budget = budget or settings.MCP_MAX_RESPONSE_CHARS
    if not fields or json_size(payload) <= budget:
        return []
    originals = [container[key] for container, key in fields]

    def cut_to(cap: int) -> None:
        for (container, key), text in zip(fields, originals, strict=True):
            container[key] = text if len(text) <= cap else text[:cap] + truncation_note(len(text) - cap)

    # The size is monotonic in the cap and JSON escaping makes it hard to predict: search for it.
    fits, too_long = 0, max(len(text) for text in originals)
    while too_long - fits > 1:
        middle = (fits + too_long) // 2
        cut_to(middle)
        if json_size(payload) <= budget:
            fits = middle
        else:
            too_long = middle
    cut_to(fits)
    return [field for field, text in zip(fields, originals, strict=True) if len(text) > fits]


def fit_list(items: list[dict[str, Any]], text_key: str, *, envelope: Any = None, flag_key: str | None = None) -> bool:
    """Fit a list of results (inside ``envelope``, or alone) by cutting each item's ``text_key``
    (and setting its ``flag_key`` when cut), then dropping items from the end if even empty texts
    are too many. True if anything was cut or dropped."""
    payload = items if envelope is None else envelope
    cut = fit_texts(payload, [(item, text_key) for item in items])
    for item, _ in cut:
        if flag_key:
            item[flag_key] = True
    return drop_to_fit(items, payload) or bool(cut)


def drop_to_fit(items: list[Any], payload: Any) -> bool:
    """Drop items from the end of a list inside ``payload`` until the payload fits; True if any went.

    The size grows with the number of items kept: the most that fit are found by bisection, so a
    listing of thousands costs a few serialisations, not one per item dropped."""
    budget = settings.MCP_MAX_RESPONSE_CHARS
    if not items or json_size(payload) <= budget:
        return False
    everything = list(items)
    fits, too_many = 0, len(everything)
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        items[:] = everything[:middle]
        if json_size(payload) <= budget:
            fits = middle
        else:
            too_many = middle
    items[:] = everything[:fits]
    return True
