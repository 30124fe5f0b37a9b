"""What a shell user of ``sparkbatch`` sees: stdout carries exactly one JSON line, the result;
everything else (vLLM's and Dagster's logs, the progress bar, advice) goes to stderr, and
errors are one ``sparkbatch:`` line with the fix. ``--debug`` brings back the framework logs,
library warnings and tracebacks.

Example::

    with json_stdout() as emit:   # vLLM, its engine process, print(): all on stderr now
        emit({"rows": 2000})      # printed on the real stdout when the block ends
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

_debug = False


def configure(debug: bool) -> None:
    """Set how loud this process (and the engine processes it starts) may be."""
    global _debug
    _debug = debug
    if debug:
        return
    # Child processes (vLLM's engine core, `vllm serve`) read these at their start.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # Deprecation and beta notices from libraries, Dagster's "no dagster.yaml, using defaults":
    # nothing a user of this command can act on.
    warnings.simplefilter("ignore")
    logging.getLogger("dagster").setLevel(logging.ERROR)


def run_config(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dagster run config for a CLI run: its console log off unless --debug (the events stay in
    the Dagster instance, where `dagster dev` shows them); a failure is reported once, by us."""
    config = dict(extra or {})
    if not _debug:
        config["loggers"] = {"console": {"config": {"log_level": "CRITICAL"}}}
    return config


@contextlib.contextmanager
def json_stdout() -> Iterator[Any]:
    """Send everything written to stdout, by this process or its children, to stderr while the
    block runs; then print what ``emit`` was given as one JSON line on the real stdout."""
    import json

    result: list[Any] = []
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # file-descriptor level: C code and child processes write here too
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield result.append
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
    for obj in result:
        print(json.dumps(obj, default=str), flush=True)


def error_line(exc: BaseException) -> str | None:
    """One line for an error a user can fix (ours, or one a Dagster step raised); None for a bug."""
    from ..errors import SparkbatchError

    cause = exc if isinstance(exc, SparkbatchError) else getattr(exc, "user_exception", None)
    if isinstance(cause, SparkbatchError):
        return f"sparkbatch: {cause}"
    if cause is not None:  # an input or library error inside a step: its first line, not the stack
        first = (str(cause).strip().splitlines() or [""])[0]
        return f"sparkbatch: {type(cause).__name__}: {first} (run again with --debug for the traceback)"
    return None


def exit_code(exc: BaseException) -> int:
    """3: a brake stopped the run on purpose (run again to continue); 2: an error of ours, inside a
    Dagster step too (a setting or input to fix); 1: anything else."""
    from ..errors import BudgetStop, SparkbatchError

    cause = exc if isinstance(exc, SparkbatchError) else getattr(exc, "user_exception", None)
    if isinstance(cause, BudgetStop):
        return 3
    return 2 if isinstance(exc, SparkbatchError) else 1


def debugging() -> bool:
    return _debug
