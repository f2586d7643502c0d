"""What the knowledge base's management commands share: error reporting and output formats.

A KBError becomes ``CommandError: CODE: message`` and exit status 1; ``--json`` output is the
same JSON the REST API answers (kb.api.schemas), errors too (``{"error": {"code", "message"}}``
on stdout), so scripts can switch between the two.
"""

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter
from pydantic import BaseModel

from kb.errors import KBError

# Control characters but tab and newline (C0, DEL, C1): stored text is anybody's, and a note holding
# ESC sequences had retitled, cleared and hidden the operator's terminal through kb_search.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Printable:
    """A text stream that writes control characters as visible escapes (``\\x1b``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(_CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's order of options, with the description's lines (its examples) kept as written."""


class ExamplesInHelp(BaseCommand):
    """A command whose ``--help`` keeps the lines of its description (its examples) as written."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = HelpFormatter
        return parser


class KBCommand(ExamplesInHelp):
    """Output goes through ``Printable`` (stdout; progress bars draw on stderr)."""

    def __init__(self, stdout: TextIO | None = None, **kwargs: Any) -> None:
        super().__init__(stdout=Printable(stdout or sys.stdout), **kwargs)

    def execute(self, *args: Any, **options: Any) -> str | None:
        if options.get("stdout"):
            options["stdout"] = Printable(options["stdout"])
        try:
            return super().execute(*args, **options)
        except KBError as error:
            if options.get("json"):  # a script reading the output gets the REST API's error body
                self.write_json(error.as_dict())
            raise CommandError(f"{error.code}: {error.message}") from error

    def write_json(self, data: BaseModel | dict[str, Any] | list[Any]) -> None:
        payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        self.stdout.write(json.dumps(payload, indent=2, ensure_ascii=False, default=str))

    def write_table(self, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.stdout.write(format_table(headers, rows))


def positive_seconds(value: str) -> float:
    """An argparse type: a wait of some seconds (a negative or zero wait gave up before looking)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of seconds greater than 0")
    return seconds


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned text columns, numbers right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(str(header)), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) and bool(rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(padded).rstrip()

    return "\n".join([line([str(h) for h in headers]), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)
