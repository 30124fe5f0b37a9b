"""A full or read-only disk under the home, in process (issue 49; the CLI and real disks:
tests/e2e/test_full_disk.py): an atomic write that fails removes its temporary file and leaves
the old file whole; which errors are a full, read-only or forbidden disk (:func:`storage_error`);
a shard run failed by ENOSPC mid-way keeps its checkpointed rows, and the next run finishes it
sending only the others; an attempt's record that cannot be written at the end does not hide
the run's own error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import SparkbatchError
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.errors import StorageError, storage_error, storage_errors
from sparkbatch_dagster.home import JobHome, atomic, atomic_write_parquet, atomic_write_text
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.run.attempts import Attempt
from sparkbatch_dagster.testing import label_shard
from testkit import make_spec, unique_rows, write_parquet

V = "0123456789abcdef"


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch):
    """``inject("write:part@2=ENOSPC")``: that failpoint, its hit count from zero."""
    def set_point(value: str | None) -> None:
        monkeypatch.setattr(atomic, "_hits", {})
        if value is None:
            monkeypatch.delenv("SPARKBATCH_FAILPOINT", raising=False)
        else:
            monkeypatch.setenv("SPARKBATCH_FAILPOINT", value)

    return set_point


def _temporary(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if "tmp" in p.name or p.name.startswith(".merge-")]


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS"])
def test_a_failed_atomic_write_removes_its_temporary_file(tmp_path, inject, code):
    path = tmp_path / "stats" / "shard-00000.json"
    atomic_write_text(path, "old")
    inject(f"write:stats={code}")
    with pytest.raises(OSError) as info:
        atomic_write_text(path, "new", point="write:stats")
    assert info.value.errno == getattr(errno, code) and info.value.filename
    assert path.read_text() == "old" and _temporary(tmp_path) == []
    inject(f"write:part={code}")
    with pytest.raises(OSError):
        atomic_write_parquet(tmp_path / "part-000001.parquet", pa.table({"x": [1]}), point="write:part")
    assert not (tmp_path / "part-000001.parquet").exists() and _temporary(tmp_path) == []


def test_a_failed_fsync_removes_the_temporary_file_too(tmp_path, monkeypatch):
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write_text(tmp_path / "home" / "current.json", "{}")
    assert info.value.filename == str(tmp_path / "home" / "current.json")  # fsync names no file: the path is added
    assert list((tmp_path / "home").iterdir()) == []


def test_which_errors_are_a_full_or_read_only_home(tmp_path):
    home = tmp_path / "home"
    full = storage_error(OSError(errno.ENOSPC, "No space left on device", str(home / "out" / "x.parquet")), home)
    assert isinstance(full, StorageError) and full.kind == "full"
    assert str(full) == (f"{home}: the disk is full (ENOSPC: No space left on device, writing {home}/out/x.parquet): "
                         "free space and run again; nothing committed was lost")
    assert storage_error(OSError(errno.EDQUOT, "Disk quota exceeded"), home).kind == "full"
    assert str(storage_error(OSError(errno.EROFS, "Read-only file system"), home)).startswith(
        f"{home}: the disk is read-only (EROFS: Read-only file system): make it writable")
    denied = storage_error(OSError(errno.EACCES, "Permission denied", str(home / "a")), home)
    assert str(denied) == (f"{home}: writing is not permitted (EACCES: Permission denied: {home}/a): give this user "
                           "write access (or the job another home) and run again; nothing committed was lost")
    assert storage_error(OSError(errno.EACCES, "Permission denied", str(home / "a")), None) is None  # whose?
    # Permission denied elsewhere (an input file) is not the home's: left as it is.
    assert storage_error(PermissionError(errno.EACCES, "Permission denied", "/data/in.csv"), home) is None
    # A full disk elsewhere names that folder.
    assert storage_error(OSError(errno.ENOSPC, "x", "/scratch/t.bin"), home).where == "/scratch"
    # DuckDB's and SQLite's errors carry only their text.
    import duckdb

    text = 'TransactionContext Error: Failed to commit: Could not write file "m.wal": No space left on device'
    assert storage_error(duckdb.TransactionException(text), home).detail == text
    assert storage_error(RuntimeError("database or disk is full"), home).kind == "full"
    # Raised from, during, or as a Dagster step's user_exception: found.
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("step failed") from exc
    except RuntimeError as wrapped:
        assert storage_error(wrapped, home).kind == "full"

    class StepError(Exception):
        user_exception = OSError(errno.EROFS, "Read-only file system")

    assert storage_error(StepError(), home).kind == "read-only"
    # Ours already says what it means; anything else is not a disk's.
    assert storage_error(SparkbatchError("x"), home) is None and storage_error(ValueError("no"), home) is None
    assert storage_error(OSError(errno.ENOENT, "No such file"), home) is None
    with pytest.raises(StorageError, match="disk is full"), storage_errors(home):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(KeyError), storage_errors(home):
        raise KeyError("x")


def test_enospc_mid_shard_keeps_the_checkpointed_rows_and_the_rerun_finishes(tmp_path, inject):
    n = 60
    src = write_parquet(tmp_path / "in" / "rows.parquet", unique_rows(n))
    spec = make_spec(tmp_path, input=str(src), shards=1, checkpoint_rows=10, checkpoint_seconds=600)
    home = JobHome(spec.home_path)
    build_shards(spec, home)
    inject("write:part@3=ENOSPC")  # two parts down, the third fails; stopping, the rows are flushed again
    first = FakeEngine()
    with pytest.raises(OSError) as info:
        label_shard(spec, home, V, "shard-00000", first)
    assert info.value.errno == errno.ENOSPC and "part-000003" in str(info.value.filename)
    assert _temporary(home.root) == [] and not home.labeled_path(V, "shard-00000").exists()
    kept = {r for p in home.parts_dir(V, "shard-00000").glob("part-*.parquet")
            for r in pq.read_table(p).column("row_id").to_pylist()}
    assert len(kept) >= 20
    inject(None)  # space freed
    second = FakeEngine()
    label_shard(spec, home, V, "shard-00000", second)
    ids = pq.read_table(home.labeled_path(V, "shard-00000")).column("row_id").to_pylist()
    assert sorted(ids) == sorted(r["id"] for r in unique_rows(n))  # every row exactly once
    assert second.requests_seen == n - len(kept) and _temporary(home.root) == []


def test_an_attempt_record_that_cannot_be_written_at_its_end_does_not_hide_the_runs_error(tmp_path, inject):
    home = JobHome(tmp_path / "home")
    inject("write:attempt@2=ENOSPC")  # the first record is written; the end is not
    with pytest.raises(ValueError, match="the run's own"), Attempt(home, V, 1.0):
        raise ValueError("the run's own error")
    assert _temporary(home.root) == []
    inject("write:attempt@2=ENOSPC")
    with pytest.raises(OSError, match="No space"), Attempt(home, V, 1.0):
        pass  # a run that succeeded: its end not written is the error


def test_a_full_disk_while_sharding_is_one_error_and_leaves_no_folder(tmp_path, monkeypatch):
    import duckdb

    from sparkbatch_dagster.inputs import shards

    def full(con: object, spec: object, fmt: str, files: list[str], tmp: Path) -> None:
        (tmp / "_shard=0").mkdir(parents=True)  # DuckDB's COPY into the temporary folder met the full disk
        raise duckdb.IOException('IO Error: Could not write file "shard.parquet": No space left on device')

    monkeypatch.setattr(shards, "_read_in_one_go", full)
    monkeypatch.setattr(shards, "_stage", lambda *a: pytest.fail("a full disk taken for bad input: re-read"))
    spec = make_spec(tmp_path, n=40, shards=2)
    home = JobHome(spec.home_path)
    with pytest.raises(StorageError) as info:  # not taken for bad input and re-read line by line
        build_shards(spec, home)
    assert str(info.value).startswith(f"{home.root}: the disk is full (IO Error: Could not write file")
    assert _temporary(home.root) == [] and home.read_manifest() is None
