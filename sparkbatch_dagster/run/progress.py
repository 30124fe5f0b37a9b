"""Progress of a labeling run, for people watching it.

The runner reports every second. :class:`Relay` passes each report to in-process listeners
(``sparkbatch run`` draws a progress bar from them) and writes one readable line to the Dagster
log every ``log_every_s`` seconds, so a long run shows rows done / total of the run and of the
current partition, tokens/s and an ETA at a steady pace without flooding the event log.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from .records import ProgressReport

Report = ProgressReport
_listeners: list[Callable[[Report], None]] = []


@contextmanager
def listening(fn: Callable[[Report], None]) -> Iterator[None]:
    """Call ``fn`` with every progress report made in this process while the block runs."""
    _listeners.append(fn)
    try:
        yield
    finally:
        _listeners.remove(fn)


def tell(text: str) -> None:
    """A line for the people watching (the prediction of ``sparkbatch run --estimate``): every
    listener that takes notes (a :class:`Bar`) shows it."""
    for fn in list(_listeners):
        note = getattr(fn, "note", None)
        if note is not None:
            note(text)


class Relay:
    """Fans reports out: every one to the listeners, one per ``log_every_s`` to ``log``."""

    def __init__(self, log: Callable[[str], None], log_every_s: float = 10.0) -> None:
        self.log, self.log_every_s = log, log_every_s
        self._last_log = time.monotonic()

    def __call__(self, report: Report) -> None:
        for fn in list(_listeners):
            fn(report)
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s or report.finished:
            self._last_log = now
            self.log(log_line(report))


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def log_line(report: Report) -> str:
    """``labeled 1,200 of 2,000 rows (60%); shard-00004 120 of 250; 3,410 tokens/s; ETA 0:45``"""
    done, total = report.rows_done, report.rows_total
    part = report.partition
    if report.partition_rows_total is not None:
        part += f" {report.partition_rows_done or 0:,} of {report.partition_rows_total:,}"
    eta = "ETA unknown until 10 s of answers" if report.eta_s is None else f"ETA {_clock(report.eta_s)}"
    return (f"labeled {done:,} of {total:,} rows ({done / max(total, 1):.0%}); {part}; "
            f"{report.tokens_per_s:,.0f} tokens/s; {eta}")


def bar_line(report: Report, width: int = 30) -> str:
    """``[#########.....] 1200/2000 rows  3,410 tok/s  ETA 0:45  shard-00004``"""
    done, total = report.rows_done, max(report.rows_total, 1)
    filled = min(width, int(width * done / total))
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{report.rows_total} rows  "
            f"{report.tokens_per_s:,.0f} tok/s  ETA {_clock(report.eta_s)}  {report.partition}")


class Bar:
    """A progress bar on a terminal (redrawn in place each second), or a plain line every
    ``line_every_s`` seconds when the stream is a file or a pipe (CI logs, ``| tee``)."""

    def __init__(self, stream: TextIO = sys.stderr, line_every_s: float = 5.0) -> None:
        self.stream, self.line_every_s = stream, line_every_s
        self.tty = stream.isatty()
        self._last = 0.0
        self._open = False

    def __call__(self, report: Report) -> None:
        finished = report.finished
        if self.tty:
            self.stream.write("\r" + bar_line(report) + ("\n" if finished else ""))
            self._open = not finished
        elif finished or time.monotonic() - self._last >= self.line_every_s:
            self._last = time.monotonic()
            self.stream.write(bar_line(report) + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """One line of its own, ``sparkbatch: <text>``, below the bar."""
        self.close()
        self.stream.write(f"sparkbatch: {text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False
