"""Progress of long commands: a tqdm bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns, which turn logs and CI output into one endless
line; when the stream is not a terminal every step is printed as a line of its own instead
(rate-limited for counters that move often).
"""

import time
from types import TracebackType
from typing import Any, TextIO

from tqdm import tqdm

# Seconds between two plain lines of a counter that moves (non-terminal output only).
PLAIN_INTERVAL_SECONDS = 2.0


class Progress:
    def __init__(self, stream: Any, *, description: str, unit: str, total: int | None = None) -> None:
        # Django wraps its streams in an OutputWrapper that appends newlines: tqdm needs the raw stream.
        raw: TextIO = getattr(stream, "_out", stream)
        self.description = description
        self.unit = unit
        self.total = total
        self.count = 0
        self._stream = raw
        self._last_line = 0.0
        self._bar = None
        if _is_tty(raw):
            self._bar = tqdm(total=total, desc=description, unit=f" {unit}", file=raw, dynamic_ncols=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def step(self, note: str = "") -> None:
        """One more item done; ``note`` says which (printed as a line when not on a terminal)."""
        self.count += 1
        if self._bar is not None:
            self._bar.update(1)
        else:
            total = f"/{self.total}" if self.total else ""
            self._print(f"{self.description} [{self.count}{total}] {note}".rstrip())

    def update_to(self, count: int, total: int | None = None) -> None:
        """The counter is at ``count`` (of ``total``), e.g. chunks embedded so far."""
        changed = count != self.count or total != self.total
        self.count, self.total = count, total if total is not None else self.total
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.n = count
            self._bar.refresh()
        elif changed and (time.monotonic() - self._last_line >= PLAIN_INTERVAL_SECONDS or count == self.total):
            self._print(f"{self.description}: {count}/{self.total} {self.unit}")

    def note(self, message: str) -> None:
        """A message that must not be drawn over by the bar."""
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            self._print(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _print(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()
        self._last_line = time.monotonic()


def _is_tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
