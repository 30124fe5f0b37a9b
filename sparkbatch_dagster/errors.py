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
