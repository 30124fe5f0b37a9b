"""How far a labeling run is and how fast it goes: the numbers behind its progress line's ETA
and its brake's forecast (:class:`Pace`).

Rows done without the engine (resumed, reused from the result store, error rows) count as done
but not in the rate: they are done at once and say nothing of the engine's pace. The rate is
measured from the first answer, not from the run's start: before it the engine was starting, and
a rate over that minute would quote an ETA of hours for a job of minutes::

    pace = Pace(rows_total=1000)
    pace.count_free(200)          # resumed rows
    pace.answered()               # the engine's first answer: the rate's clock starts
    pace.rows_done += 1
    pace.report("shard-00000", tokens=420).eta_s
"""

from __future__ import annotations

import time

from .records import ProgressReport
from .shard_stats import progress_report


class Pace:
    """Rows done (free ones apart), the first answer's time, the longest commit."""

    def __init__(self, rows_total: int = 0) -> None:
        self.rows_total = rows_total  # of the shards the attempt holds
        self.rows_done = 0  # rows with a result: generated, fanned out, error rows, resumed
        self.rows_free = 0  # of those, resumed, reused and error rows
        self.first_answer: float | None = None
        self.done_at_first = 0  # engine rows done at the first answer (the ETA's base)
        self.all_at_first = 0  # rows done, free ones included, at the first answer (the brake's base)
        self.longest_commit = 0.0
        #: Rows per second to quote an ETA with before the run has measured its own (the estimate's).
        self.expected_rows_per_s: float | None = None
        self.window_s = 10.0  # seconds of answers before the run's own rate is trusted

    def count_free(self, rows: int) -> None:
        """Rows done without the engine: done, but not in the rate."""
        self.rows_done += rows
        self.rows_free += rows

    def answered(self) -> None:
        """An answer came in: the first one starts the rate's clock."""
        if self.first_answer is None:
            self.first_answer = time.perf_counter()
            self.done_at_first = self.rows_done - self.rows_free
            self.all_at_first = self.rows_done

    def brake_rate(self, trusted_after_s: float) -> float | None:
        """Rows per second since the first answer, once ``trusted_after_s`` of answers are behind
        it (the first few say little of the pace); None before."""
        if self.first_answer is None:
            return None
        seconds = time.perf_counter() - self.first_answer
        if seconds >= trusted_after_s and self.rows_done > self.all_at_first:
            return (self.rows_done - self.all_at_first) / seconds
        return None

    def report(self, key: str, tokens: int) -> ProgressReport:
        """The progress report of a run whose last answer belonged to shard ``key``."""
        first = self.first_answer
        seconds = time.perf_counter() - first if first is not None else 0.0
        measured = self.rows_done - self.rows_free - (self.done_at_first if first is not None else 0)
        return progress_report(key, self.rows_done, self.rows_total, tokens, seconds, measured,
                               self.expected_rows_per_s, self.window_s)
