"""Issue 49 through the CLI: `sparkbatch sql` cannot rewrite committed output (the bug report's
`COPY` over a committed shard is refused, and a labeled file replaced anyway is found, not counted
done), and a damaged home heals: a truncated shard file, `metrics.duckdb` or a replaced labeled
file, then `sql`, `run`, `status` give the full, correct result, or one `sparkbatch:` line naming
the file and the fix. A bucket home's cache copy that is not what its commit recorded is fetched
again. (In-process, with more cases: tests/unit/test_read_only.py.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from e2e.test_bucket_home import SHARDS as BUCKET_SHARDS
from e2e.test_bucket_home import BucketJob
from e2e.test_bucket_home import N as BUCKET_N
from e2e.test_cli_streams import _cli, _defs

ROWS = 90  # _defs' input, in 3 shards


def _json(proc) -> dict:
    return json.loads(proc.stdout)


def _labeled(tmp_path: Path, key: str) -> Path:
    [path] = (tmp_path / "home" / "out").glob(f"*/labeled/{key}.parquet")
    return path


def _finished(tmp_path: Path) -> tuple[str, dict]:
    """A finished folder home: the definitions file and the label distribution `sql` gives."""
    defs = str(_defs(tmp_path))
    assert _json(_cli(tmp_path, "run", "-f", defs))["rows"] == ROWS
    dist = _json(_cli(tmp_path, "sql", "-f", defs, "FROM label_distribution"))["rows"]
    assert sum(n for _, n in dist) == ROWS
    return defs, dist


def _sparkbatch_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("sparkbatch:")]


def test_the_bug_reports_copy_is_refused_and_status_and_run_stay_whole(tmp_path):
    defs, dist = _finished(tmp_path)
    labeled = _labeled(tmp_path, "shard-00000")
    before = labeled.read_bytes()
    for query in (f"COPY (SELECT * FROM '{labeled}' LIMIT 1) TO '{labeled}' (FORMAT parquet)",
                  "SELECT * FROM read_text('/etc/hostname')", "DROP VIEW labeled",
                  f"ATTACH '{tmp_path / 'home' / 'metrics.duckdb'}' AS m"):
        bad = _cli(tmp_path, "sql", "-f", defs, query, ok=False)
        assert bad.stdout == "" and "Traceback" not in bad.stderr
        assert _sparkbatch_lines(bad.stderr) == bad.stderr.strip().splitlines()[-1:]
        assert bad.stderr.strip().splitlines()[-1].startswith("sparkbatch: query refused: ")
    assert labeled.read_bytes() == before
    assert _json(_cli(tmp_path, "status", "-f", defs))["partitions_done"] == 3
    again = _json(_cli(tmp_path, "run", "-f", defs))
    assert again["rows"] == ROWS and again["partitions_run"] == 0 and again["success"] is True


@pytest.mark.parametrize("damage", ["shard", pytest.param("metrics", marks=pytest.mark.long), "labeled"])
def test_a_damaged_home_heals_on_the_next_run(tmp_path, damage):
    defs, dist = _finished(tmp_path)
    home = tmp_path / "home"
    if damage == "shard":
        target = home / "shards" / "shard-00001.parquet"
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "metrics":
        target = home / "metrics.duckdb"
        target.write_bytes(target.read_bytes()[:1000])
    else:  # replaced after its commit, by something other than `sql` (the commit record finds it)
        target = _labeled(tmp_path, "shard-00000")
        pq.write_table(pq.read_table(target).slice(0, 1), target)
    # Before any run: the full result, or one line naming the file and the fix.
    query = _cli(tmp_path, "sql", "-f", defs, "FROM label_distribution", ok=damage != "shard")
    if damage == "shard":
        lines = query.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"sparkbatch: {target} is damaged"), query.stderr
        assert "`sparkbatch run`" in lines[0] and "Traceback" not in query.stderr
    elif damage == "metrics":
        assert _json(query)["rows"] == dist
    else:  # the replaced shard is left out, and said so
        assert sum(n for _, n in _json(query)["rows"]) < ROWS and "shard-00000 of version" in query.stderr
        assert _json(_cli(tmp_path, "status", "-f", defs))["missing"] == ["shard-00000"]
    run = _cli(tmp_path, "run", "-f", defs)
    summary = _json(run)
    assert summary["rows"] == ROWS and summary["success"] is True and summary["generated"] == 0
    assert summary["partitions_run"] == (1 if damage == "labeled" else 0)
    assert _json(_cli(tmp_path, "sql", "-f", defs, "FROM label_distribution"))["rows"] == dist
    status = _json(_cli(tmp_path, "status", "-f", defs))
    assert status["partitions_done"] == 3 and status["missing"] == []
    if damage != "shard":  # what was damaged is kept for a look, beside its rebuilt self
        assert [p.name.split(".broken-")[0] for p in target.parent.glob(f"{target.name}.broken-*")] == [target.name]


def test_a_bucket_homes_cache_copy_not_as_committed_is_fetched_again(tmp_path, s3_server):
    job = BucketJob(tmp_path, s3_server)
    job.finish("box-a", "t1")
    version = job.version()
    commit = json.loads(job.fs.cat_file(f"{job.bucket}/jobs/things/out/{version}/commits/shard-00000.json"))
    obj = job.fs.cat_file(f"{job.bucket}/jobs/things/{commit['labeled']}")
    assert commit["stats"]["labeled_sha256"] == hashlib.sha256(obj).hexdigest()  # the record rides in the commit
    cached = tmp_path / "box-a" / "cache" / "out" / version / "labeled" / "shard-00000.parquet"
    pq.write_table(pq.read_table(cached).slice(0, 1), cached)
    marker = cached.parent.parent / "commits" / "shard-00001.json"  # the cache's copy of a commit, truncated
    whole = marker.read_bytes()
    marker.write_bytes(whole[: len(whole) // 2])
    status, err = job.finish("box-a", "t2", "status")
    assert status["partitions_done"] == BUCKET_SHARDS and "fetched again" in err
    assert cached.read_bytes() == obj and marker.read_bytes() == whole
    summary, _ = job.finish("box-a", "t3")
    assert summary["rows"] == BUCKET_N and job.traced("t3") == 0


def test_the_checker_finds_a_labeled_file_not_as_its_commit_recorded(tmp_path):
    from checker import Generation, check_rows
    from checker_home import not_as_recorded
    from e2e.test_harness import V0, _folder, _record

    rows = [("r1", "apple"), ("r2", "car")]
    view = _folder(tmp_path, {V0: rows})  # a record from before the hash: its rows are checked
    labeled = tmp_path / "home" / "out" / V0 / "labeled" / "shard-00000.parquet"
    stats_path = labeled.parent.parent / "stats" / "shard-00000.json"
    rec = _record(view, [Generation(0, rows, V0)])
    assert check_rows(rec, {V0: view.commits(V0)}) == []
    data = labeled.read_bytes()
    stats = {**json.loads(stats_path.read_text()), "labeled_sha256": hashlib.sha256(data).hexdigest(),
             "labeled_bytes": len(data)}
    stats_path.write_text(json.dumps(stats))
    assert check_rows(rec, {V0: view.commits(V0)}) == []
    # The same rows written again with other bytes (another writer's metadata): the hash tells.
    table = pq.read_table(labeled)
    pq.write_table(table, labeled, compression="gzip")
    assert not_as_recorded(labeled.read_bytes(), stats) is not None
    found = [b.message for b in check_rows(rec, {V0: view.commits(V0)})]
    assert any("shard-00000's labeled file is not what its commit recorded" in m for m in found), found
    pq.write_table(table.slice(0, 1), labeled)  # the bug report's one row: rows missing too
    found = [b.message for b in check_rows(rec, {V0: view.commits(V0)})]
    assert any("1 rows, the commit recorded 2" in m for m in found) and any("missing" in m for m in found), found
