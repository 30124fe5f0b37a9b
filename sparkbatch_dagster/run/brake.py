"""The brake: a run stops before it costs more than the user meant to spend (``max_cost_usd``) or
outlasts the rental (``deadline``), with every finished row saved.

:class:`ShardRun` asks :meth:`Brake.check` before its first prompt and after every answer (a
few additions: the earlier attempts' bill is read once, when the brake is made). The bill is
the version's: every earlier attempt of this output version (``attempts.py``, failed and
killed ones included) plus this attempt so far, plus the rest at the rate this run measures, or,
before it has measured one, the estimate's. With neither, only the money already spent can stop
it (the up-front refusal needs a prediction: ``--estimate``, or an earlier ``sparkbatch
estimate`` of the same version).

Example::

    brake = Brake(hourly_rate_usd=0.79, max_cost_usd=2.0, deadline=parse_deadline("2h30m"))
    brake.check(Position(rows_done=0, rows_total=10_000), spent_usd=0.01)   # raises BudgetStop
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ..errors import BudgetStop, ConfigError

#: Seconds kept before the deadline, by default, to flush the last rows, commit and close the
#: engine (a GPU engine's shutdown takes seconds); the longest commit measured is added twice.
DEADLINE_MARGIN_S = 30.0
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def price(seconds: float, hourly_rate_usd: float) -> float:
    """What ``seconds`` of the box cost at its hourly rate (``JobSpec.hourly_rate_usd``)."""
    return seconds / 3600 * hourly_rate_usd


def parse_deadline(text: str, now: datetime | None = None) -> datetime:
    """A deadline from the command line: a time with its zone (``2026-12-01T18:00:00+00:00``) or a
    duration from now (``2h30m``, ``45m``, ``90s``). A time without a zone, or one already past,
    is a :class:`ConfigError` naming the value and the fix."""
    now = now or datetime.now(timezone.utc)
    match = _DURATION.match(text.strip())
    if match and any(match.groups()):
        h, m, s = (int(g or 0) for g in match.groups())
        return now + timedelta(hours=h, minutes=m, seconds=s)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"deadline {text!r} is neither a time nor a duration: write e.g. "
                          "2026-12-01T18:00:00+00:00 (when the rental ends) or 2h30m (from now)") from None
    if when.utcoffset() is None:
        raise ConfigError(f"deadline {text!r} has no time zone: write it with one, e.g. {when.isoformat()}+00:00, "
                          "or as a duration from now (2h30m)")
    return check_deadline(when, now)


def check_max_cost(value: float | None, setting: str = "max_cost_usd") -> float | None:
    """``value``, or a :class:`ConfigError` when it is negative (checked before any engine starts)."""
    if value is not None and value < 0:
        raise ConfigError(f"{setting}={value:g} is negative: give the most the job may cost, in USD (e.g. 2.5)")
    return value


def check_deadline(when: datetime, now: datetime | None = None) -> datetime:
    """``when``, or a :class:`ConfigError` when it has passed (checked before any engine starts)."""
    now = now or datetime.now(timezone.utc)
    if when <= now:
        raise ConfigError(f"deadline {when.isoformat()} has passed (it is {now.isoformat(timespec='seconds')}): "
                          "set a later one (JobSpec.deadline, --deadline), e.g. --deadline 2h")
    return when


@dataclass
class Position:
    """Where a run stands when the brake looks: rows with a result (generated, reused, error
    rows, resumed) of the run's rows, partitions committed, and the rows per second it measured
    (None until it has ``Brake.window_s`` of answers)."""

    rows_done: int
    rows_total: int
    partitions_done: int = 0
    partitions_total: int = 0
    measured_rows_per_s: float | None = None
    longest_commit_s: float = 0.0


@dataclass
class Brake:
    """What a run may spend and until when. ``spent_before_usd``: the version's earlier attempts;
    ``predicted_rows_per_s``: the estimate's rate (input rows per second, stored ones included),
    used until the run measures its own; ``restart_s``: the engine start a continuation pays
    again; ``command``: how the user continues (named in the stop's line)."""

    hourly_rate_usd: float
    max_cost_usd: float | None = None
    deadline: datetime | None = None
    margin_s: float = DEADLINE_MARGIN_S
    spent_before_usd: float = 0.0
    predicted_rows_per_s: float | None = None
    restart_s: float = 0.0
    command: str = "sparkbatch run"

    @property
    def active(self) -> bool:
        return self.max_cost_usd is not None or self.deadline is not None

    def check(self, pos: Position, spent_usd: float, now: datetime | None = None) -> None:
        """Raise :class:`BudgetStop` when the run must stop here: the version's predicted bill
        over ``max_cost_usd``, or ``deadline`` closer than the margin. ``spent_usd``: this attempt so far."""
        if self.deadline is not None:
            self._check_deadline(pos, spent_usd, now or datetime.now(timezone.utc))
        if self.max_cost_usd is not None:
            self._check_cost(pos, spent_usd)

    def rest_s(self, pos: Position) -> float | None:
        """Seconds of generation left at the measured rate (the estimate's before one is measured)."""
        rate = pos.measured_rows_per_s or self.predicted_rows_per_s
        left = pos.rows_total - pos.rows_done
        return 0.0 if left <= 0 else left / rate if rate else None

    def _usd(self, seconds: float) -> float:
        return price(seconds, self.hourly_rate_usd)

    def _check_cost(self, pos: Position, spent_usd: float) -> None:
        assert self.max_cost_usd is not None
        spent = self.spent_before_usd + spent_usd
        rest = self.rest_s(pos)
        if rest is None:  # no rate yet, no prediction: only what is already spent can stop it
            if spent <= self.max_cost_usd:
                return
            rest_text = "the rest at a rate not measured yet"
            raise_to = None
        else:
            predicted = spent + self._usd(rest)
            if predicted <= self.max_cost_usd:
                return
            # To finish later: what is spent, the rest, and the engine start the next run pays again.
            raise_to = math.ceil((predicted + self._usd(self.restart_s)) * 100) / 100
            rest_text = f"~${self._usd(rest):.2f} more for the rest ({self._rate_text(pos)}): ~${predicted:.2f} in all"
        how = (f"`{self.command} --max-cost {raise_to:.2f}`" if raise_to is not None
               else f"`{self.command}` with a higher --max-cost")
        raise BudgetStop(
            f"{self._refused(pos)} by max_cost_usd={self.max_cost_usd:g}: {self._done(pos)}; "
            f"${spent:.2f} spent (this version's attempts), {rest_text}; to continue: {how} "
            "(or without --max-cost)", raise_to_usd=raise_to)

    def _check_deadline(self, pos: Position, spent_usd: float, now: datetime) -> None:
        assert self.deadline is not None
        margin = self.margin_s + 2 * pos.longest_commit_s
        left_s = (self.deadline - now).total_seconds()
        if left_s > margin:
            return
        rest = self.rest_s(pos)
        rest_text = (f"~{rest:.0f} s (~${self._usd(rest + self.restart_s):.2f}, an engine start included) more "
                     f"({self._rate_text(pos)})" if rest is not None else "the rest at a rate not measured yet")
        raise BudgetStop(
            f"{self._refused(pos)} {max(left_s, 0):.0f} s before the deadline {self.deadline.isoformat()} "
            f"(margin {margin:.0f} s to commit): {self._done(pos)}; ${self.spent_before_usd + spent_usd:.2f} "
            f"spent; {rest_text}; to continue: `{self.command}` with a later --deadline (or on the next rental)")

    @staticmethod
    def _refused(pos: Position) -> str:
        return "stopped" if pos.rows_done or pos.partitions_done else "refused before generating"

    @staticmethod
    def _done(pos: Position) -> str:
        parts = f", {pos.partitions_done} of {pos.partitions_total} partition(s) committed" \
            if pos.partitions_total else ""
        return (f"{pos.rows_done} of {pos.rows_total} rows done{parts}, every finished row saved, "
                f"{pos.rows_total - pos.rows_done} left")

    def _rate_text(self, pos: Position) -> str:
        if pos.measured_rows_per_s:
            return f"at the measured {pos.measured_rows_per_s:.1f} rows/s"
        return f"at the estimate's {self.predicted_rows_per_s:.1f} rows/s"
