"""One base exception and a few subclasses; every message says how to fix the problem."""

from __future__ import annotations


class SparkbatchError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(SparkbatchError):
    """A job spec or resource setting is wrong; the message names the value and the fix."""


class InputError(SparkbatchError):
    """The input data cannot be read as declared (missing file, missing column)."""


class EngineError(SparkbatchError):
    """The inference engine failed to start or died while running."""


class IncompleteShardError(SparkbatchError):
    """A shard cannot be finalized because some input rows have no output row."""


class PendingRowsError(EngineError):
    """Some rows got only transient failures (5xx, timeouts): nothing was committed for them,
    and the next run retries exactly those rows."""


class BudgetStop(SparkbatchError):
    """A run stopped on purpose by its brake (``max_cost_usd`` or ``deadline``), every finished row
    saved. The message is one line: what was done, what is left, what it would cost, how to
    continue; ``raise_to_usd`` is the max cost that would let the job finish (None for a deadline)."""

    def __init__(self, message: str, raise_to_usd: float | None = None) -> None:
        super().__init__(message)
        self.raise_to_usd = raise_to_usd
