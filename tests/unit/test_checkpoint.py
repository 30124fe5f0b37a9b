import pytest

from sparkbatch_dagster.errors import IncompleteShardError
from sparkbatch_dagster.run.checkpoint import CheckpointWriter, finalize
from sparkbatch_dagster.run.records import OutputRow
from sparkbatch_dagster.run.rows import Answer, Tokens, row


def _row(i: int) -> OutputRow:
    return row(f"r{i}", "f", Answer(model="m", output="a", tokens=Tokens(prompt=1, output=1)))


def test_flushes_every_n_rows_and_resumes(tmp_path):
    w = CheckpointWriter(tmp_path / "parts", every_rows=10, every_seconds=3600)
    for i in range(25):
        w.add(_row(i))
    assert w.rows_written == 20 and w.flushes == 2  # 5 rows still in memory
    (tmp_path / "parts" / ".part-000009.parquet.tmp-1").write_text("torn write")
    again = CheckpointWriter(tmp_path / "parts", every_rows=10, every_seconds=3600)
    assert again.existing().num_rows == 20
    assert not list((tmp_path / "parts").glob(".part-*"))  # torn temp files are cleaned
    again.add(_row(20))
    again.flush()
    assert sorted(p.name for p in (tmp_path / "parts").glob("part-*"))[-1] == "part-000003.parquet"


def test_flushes_after_t_seconds(tmp_path, monkeypatch):
    w = CheckpointWriter(tmp_path / "parts", every_rows=1000, every_seconds=0.01)
    import time

    w.add(_row(0))
    time.sleep(0.02)
    w.add(_row(1))
    assert w.rows_written == 2


def test_finalize_requires_every_row_once(tmp_path):
    w = CheckpointWriter(tmp_path / "parts", every_rows=1, every_seconds=1)
    for i in [0, 1, 1, 2]:  # r1 written twice: kept once
        w.add(_row(i))
    with pytest.raises(IncompleteShardError, match="1 rows missing"):
        finalize(tmp_path / "parts", ["r0", "r1", "r2", "r3"], tmp_path / "final.parquet")
    assert (tmp_path / "parts").exists() and not (tmp_path / "final.parquet").exists()
    table = finalize(tmp_path / "parts", ["r2", "r1", "r0"], tmp_path / "final.parquet")
    assert table.column("row_id").to_pylist() == ["r2", "r1", "r0"]
    assert not (tmp_path / "parts").exists()
