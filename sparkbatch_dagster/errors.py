"""One base exception and a few subclasses; every message says how to fix the problem."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path


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


class StorageError(SparkbatchError):
    """The job's home cannot be written: its disk is full (ENOSPC, EDQUOT), it is read-only
    (EROFS) or this user may not write it (EACCES, EPERM). The run stops, its temporary files
    removed; what was committed (labeled shards, checkpointed rows) stays, and the next run
    resumes from there. :func:`storage_error` makes one from the error a write raised.

    ``kind`` is ``full``, ``read-only`` or ``denied``; ``where`` the home (or the file written,
    when that lies outside the home)."""

    _FIX = {"full": ("the disk is full", "free space and run again"),
            "read-only": ("the disk is read-only", "make it writable (or give the job another home) and run again"),
            "denied": ("writing is not permitted", "give this user write access (or the job another home) and run "
                                                   "again")}

    def __init__(self, where: str, kind: str, detail: str) -> None:
        what, fix = self._FIX[kind]
        super().__init__(f"{where}: {what} ({detail}): {fix}; nothing committed was lost")
        self.where, self.kind, self.detail = where, kind, detail


# Which errno (and, for DuckDB, Arrow and SQLite (Dagster's instance), whose errors carry only text, which
# message) means which kind.
_KINDS = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read-only", errno.EACCES: "denied",
          errno.EPERM: "denied"}
_TEXTS = {"No space left on device": "full", "Disk quota exceeded": "full", "database or disk is full": "full",
          "Read-only file system": "read-only"}


def storage_error(exc: BaseException, home: str | os.PathLike[str] | None) -> StorageError | None:
    """The :class:`StorageError` that ``exc`` (or an error it was raised from or during, or the
    one a Dagster step failed with) stands for; None when none of them is a full, read-only or
    forbidden disk. ``home``: the job's home, the ``where`` of the message (None: the file's
    folder). Permission denied counts only on a file inside the home (or one not named): elsewhere
    it is another error (an input file this user cannot read). Example::

        except Exception as exc:
            raise storage_error(exc, home.location) or exc
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, SparkbatchError):  # ours says what it means (a StorageError already classified)
            if isinstance(e, StorageError):
                return e
            continue
        found = _classify(e, None if home is None else str(home))
        if found is not None:
            return found
        todo += [e.__cause__, e.__context__, getattr(e, "user_exception", None)]
    return None


@contextlib.contextmanager
def storage_errors(home: str | os.PathLike[str]) -> Iterator[None]:
    """Raise a full, read-only or forbidden disk met inside the block as one :class:`StorageError`
    naming ``home`` (its cause kept); any other error as it is. Example::

        with storage_errors(home.root):
            yield from label_partitions(...)   # a Dagster step's failure: one line, not ENOSPC's stack
    """
    try:
        yield
    except Exception as exc:
        full = storage_error(exc, home)
        if full is None:
            raise
        raise full from exc


def _classify(e: BaseException, home: str | None) -> StorageError | None:
    kind = _KINDS.get(e.errno) if isinstance(e, OSError) and e.errno is not None else None
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if kind is None:  # DuckDB's IOException, some of Arrow's errors: only their text says it
        kind = next((k for t, k in _TEXTS.items() if t in text), None)
    if kind is None:
        return None
    file = getattr(e, "filename", None)
    inside = home is None or file is None or _under(str(file), home)
    if kind == "denied" and (home is None or not inside):  # may be a read of the input: not the home's
        return None
    if isinstance(e, OSError) and e.errno in _KINDS:
        where_in = "" if not file else f": {file}" if kind == "denied" else f", writing {file}"
        detail = f"{errno.errorcode[e.errno]}: {os.strerror(e.errno)}{where_in}"
    else:
        detail = text[:300]
    where = home if home is not None and inside else str(Path(str(file)).parent) if file else "the job's home"
    return StorageError(where, kind, detail)


def _under(file: str, home: str) -> bool:
    try:
        return Path(file).resolve().is_relative_to(Path(home).resolve())
    except (OSError, ValueError):
        return file.startswith(home)
