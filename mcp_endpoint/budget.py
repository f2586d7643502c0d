"""The response-size budget (MCP_MAX_RESPONSE_CHARS): long texts are cut, visibly, rather than
failing the call or flooding the model's context.

The budget counts the characters of the result serialised as compact JSON (a profile whose
tools answer with JSON text measures the text it sends instead: ``measure``). Texts are cut
longest first (every text above a common length is cut to it), so short chunks stay whole.
"""

import json
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings

TextField = tuple[dict[str, Any], str]  # a dict holding a text, and the key of that text
Measure = Callable[[Any], int]

# What a listed item's text keeps at least before items are left out instead: a list of hits
# whose texts were all cut to nothing (or to their truncation notes) is no use to anyone.
MIN_KEPT_CHARS = 200


def json_size(payload: Any) -> int:
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=str))


def truncation_note(cut: int) -> str:
    return f" … [{cut} more characters truncated]"


def cut_text(text: str, cap: int) -> str:
    """``text`` cut to ``cap`` characters and a note, unless the note would make it no shorter."""
    note = truncation_note(len(text) - cap)
    return text[:cap] + note if len(text) > cap + len(note) else text


def fit_texts(payload: Any, fields: Sequence[TextField], *, measure: Measure = json_size) -> list[TextField]:
    """Cut the texts at ``fields`` (in place) so that ``payload`` fits; returns the fields that were cut.

    If the payload is too large even with every text cut to nothing, they are left cut to
    nothing and the caller decides what else to drop.
    """
    budget = settings.MCP_MAX_RESPONSE_CHARS
    if not fields or measure(payload) <= budget:
        return []
    originals = [container[key] for container, key in fields]

    def cut_to(cap: int) -> None:
        for (container, key), text in zip(fields, originals, strict=True):
            container[key] = cut_text(text, cap)

    # The size grows with the cap and JSON escaping makes it hard to predict: search for it.
    fits, too_long = 0, max(len(text) for text in originals)
    while too_long - fits > 1:
        middle = (fits + too_long) // 2
        cut_to(middle)
        if measure(payload) <= budget:
            fits = middle
        else:
            too_long = middle
    cut_to(fits)
    return [field for field, text in zip(fields, originals, strict=True) if field[0][field[1]] != text]


def fit_list(
    items: list[dict[str, Any]],
    text_key: str,
    *,
    envelope: Any = None,
    flag_key: str | None = None,
    measure: Measure = json_size,
) -> bool:
    """Fit a list of results (inside ``envelope``, or alone): as many items from the start as fit
    with their ``text_key`` cut to MIN_KEPT_CHARS, then their texts as long as the budget allows
    (each cut item's ``flag_key`` set). True if anything was cut or left out."""
    payload = items if envelope is None else envelope
    if measure(payload) <= settings.MCP_MAX_RESPONSE_CHARS:
        return False
    originals = [item[text_key] for item in items]
    for item in items:
        item[text_key] = cut_text(item[text_key], MIN_KEPT_CHARS)
    dropped = drop_to_fit(items, payload, measure=measure)
    for item, text in zip(items, originals, strict=False):
        item[text_key] = text
    cut = fit_texts(payload, [(item, text_key) for item in items], measure=measure)
    for item, _ in cut:
        if flag_key:
            item[flag_key] = True
    return dropped or bool(cut)


def drop_to_fit(items: list[Any], payload: Any, *, measure: Measure = json_size) -> bool:
    """Leave items out from the end of a list inside ``payload`` until it fits, but never the
    first: a page that holds nothing would send a client paging on from the same offset forever.
    True if any went.

    The size grows with the number of items kept: the most that fit are found by bisection, so a
    listing of thousands costs a few serialisations, not one per item left out."""
    budget = settings.MCP_MAX_RESPONSE_CHARS
    if len(items) <= 1 or measure(payload) <= budget:
        return False
    everything = list(items)
    fits, too_many = 1, len(everything)
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        items[:] = everything[:middle]
        if measure(payload) <= budget:
            fits = middle
        else:
            too_many = middle
    items[:] = everything[:fits]
    return True
