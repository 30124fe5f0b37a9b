"""Batch files run as jobs on the fake engine, for the e2e tests of a line's fields and tools:
:func:`run_file` writes the lines, runs the job (its own home, one answer store shared by every
job of the test, as ``serve-batch``'s) and returns the summary with the output and error lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.testing import FakeVLLMResource


def lines_of(path: Path) -> list[dict[str, Any]]:
    """A JSONL file's objects (none when it was not written)."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_file(tmp_path: Path, lines: list[str], name: str = "in.jsonl"
             ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(``run-batch``'s summary, the output lines, the error lines) of the batch file ``lines``."""
    src = tmp_path / name
    src.write_text("\n".join(lines) + "\n")
    job, defs = batch_file_job(src, resource=FakeVLLMResource(keep_warm=True), home=tmp_path / f"{name}.home",
                               result_store=str(tmp_path / "answers"))
    summary = run_batch(job, defs, tmp_path / f"{name}.out", tmp_path / f"{name}.err")
    return summary, lines_of(tmp_path / f"{name}.out"), lines_of(tmp_path / f"{name}.err")
