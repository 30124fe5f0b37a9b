"""Each answer's confidence where a user looks: the ``review`` view (answers under
``review_below``, least sure first), the ``reliability`` view (accuracy per confidence bucket),
the analytics asset's metadata, each partition's histogram, ``sparkbatch sql`` and a defs.yaml;
files written before confidences were kept still read. Expected values are computed here from
the labeled Parquet files and the input's gold column, never from the code under test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import ConfigError, build_batch_assets
from sparkbatch_dagster.run import metrics
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import label_then_metrics, make_spec, yaml_job_spec

ROOT = Path(__file__).resolve().parents[2]


def _bucket(confidence: float) -> int:
    """The bucket by decimal arithmetic (the code floors the double x * 10)."""
    return min(int(Decimal(str(confidence)) * 10), 9)


def _run(tmp_path: Path, **overrides: Any) -> tuple[Any, Any, dict[str, Any], list[str]]:
    """input_shards, labeled_outputs over every partition, run_metrics: (job, instance, resources, keys)."""
    spec = make_spec(tmp_path, **{"n": 150, "shards": 3, **overrides})
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    res = {"vllm": FakeVLLMResource()}
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    return job, inst, res, keys


def _analytics(job: Any, inst: Any, res: dict[str, Any]) -> dict[str, Any]:
    result = materialize(job.assets, selection=[job.keys["analytics"]], resources=res, instance=inst)
    assert result.success
    return result.asset_materializations_for_node("things__analytics")[0].metadata


def _labeled(job: Any, keys: list[str]) -> list[dict[str, Any]]:
    """Every committed output row, with the input's gold and the confidence the views must show:
    the model's own (``raw_confidence``; ``confidence`` in files older than it) through the model's
    calibration as stored in the home, applied here from the JSON file itself."""
    version = job.current_version()
    gold = {r["id"]: r["gold"] for r in pq.read_table(job.spec.input).to_pylist()}
    rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()]
    maps = {d["model"]: d for d in (json.loads(f.read_text()) for f in job.home.calibration_dir.glob("*.json"))}

    def shown(r: dict[str, Any]) -> float | None:
        raw = r["raw_confidence"] if r.get("raw_confidence") is not None else r.get("confidence")
        d = maps.get(r["model"])
        if raw is None or d is None or d["method"] == "none":
            return raw
        if d["method"] == "isotonic":
            return float(np.interp(raw, d["x"], d["y"]))
        p = min(max(raw, 1e-6), 1 - 1e-6)
        return 1 / (1 + math.exp(-(d["slope"] * math.log(p / (1 - p)) + d["intercept"])))

    return [{**r, "gold": gold[r["row_id"]], "confidence": shown(r)} for r in rows]


def _seed_calibration(job: Any, keys: list[str], slope: float = 2.0, intercept: float = 0.3) -> None:
    """A Platt map of the rows' model, stored as the analytics would store one fitted on gold rows."""
    from sparkbatch_dagster.run.calibration_map import Calibration, labels_digest, save

    model = pq.read_table(job.home.labeled_path(job.current_version(), keys[0])).column("model")[0].as_py()
    labels = job.spec.output.labels
    save(Calibration(method="platt", model=model, labels_digest=labels_digest(labels), rows=100, slope=slope,
                     intercept=intercept), job.home.calibration_dir, labels)


def _query(job: Any, sql: str) -> list[tuple]:
    with duckdb.connect(str(job.home.metrics_db), read_only=True) as con:
        return con.execute(sql).fetchall()


def _expected_reliability(rows: list[dict[str, Any]]) -> list[tuple]:
    """(bucket, rows, correct, mean confidence) per non-empty bucket, from the rows themselves."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if r["confidence"] is not None:
            by.setdefault(_bucket(r["confidence"]), []).append(r)
    return [(f"{b / 10:.1f}-{(b + 1) / 10:.1f}", len(rs), sum(r["output"] == r["gold"] for r in rs),
             round(sum(r["confidence"] for r in rs) / len(rs), 4)) for b, rs in sorted(by.items())]


def test_review_lists_exactly_the_answers_under_review_below_least_sure_first(tmp_path):
    # No gold column: nothing refits the calibration seeded here, so the views must apply this one.
    job, inst, res, keys = _run(tmp_path, gold_column=None)
    _seed_calibration(job, keys)
    md = _analytics(job, inst, res)
    rows = _labeled(job, keys)
    sure = [r for r in rows if r["confidence"] is not None]
    assert len(sure) == 150  # the fake engine gives every label a confidence
    want = sorted((r["confidence"], r["row_id"]) for r in rows if r["confidence"] < 0.5)
    assert 10 < len(want) < 140  # both sides of the threshold are there
    got = _query(job, "SELECT confidence, row_id FROM review")
    assert got == want
    assert md["review_rows"].value == len(want) and md["review_below"].value == 0.5
    assert md["confidence_mean"].value == pytest.approx(sum(r["confidence"] for r in sure) / len(sure), abs=1e-4)

    # Another threshold is another view, not another output version: nothing is labeled again.
    again = build_batch_assets(spec=make_spec(tmp_path, n=150, shards=3, review_below=0.2, gold_column=None))
    assert again.output_version(res["vllm"]) == job.output_version(res["vllm"])
    assert again.spec.answer_context("m") == job.spec.answer_context("m")
    labeled = job.assets[1].code_versions_by_key[job.keys["labeled_outputs"]]
    assert again.assets[1].code_versions_by_key[again.keys["labeled_outputs"]] == labeled
    md = _analytics(again, inst, res)
    low = sorted((r["confidence"], r["row_id"]) for r in rows if r["confidence"] < 0.2)
    assert _query(again, "SELECT confidence, row_id FROM review") == low and 0 < len(low) < len(want)
    assert md["review_rows"].value == len(low) and md["review_below"].value == 0.2


def test_reliability_counts_each_bucket_against_the_gold_column(tmp_path):
    job, inst, res, keys = _run(tmp_path)
    md = _analytics(job, inst, res)
    want = _expected_reliability(_labeled(job, keys))
    # The fake's confidences say nothing of right or wrong, so its calibration puts every row near its
    # accuracy: a bucket or two (many buckets: the test without a gold column, nothing calibrated there).
    assert len(want) >= 1 and sum(w[1] for w in want) == 150
    got = _query(job, "SELECT bucket, rows, correct, mean_confidence FROM reliability")
    assert [g[:3] for g in got] == [w[:3] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], abs=1e-4)
    assert _query(job, "SELECT bucket, accuracy FROM reliability") == [(b, round(c / n, 4)) for b, n, c, _ in want]
    table = md["reliability"].value
    for bucket, n, correct, _ in want:
        assert f"| {bucket} | {n} | {n} | {correct} | {round(correct / n, 4)} |" in table  # every row has gold
    top = want[-1]  # the most confident bucket leads the sentence a user reads
    summary = md["reliability_summary"].value.splitlines()
    assert summary[0].startswith(f"confidence {top[0]}: right {top[2] / top[1]:.0%} of the time ({top[1]} rows")
    assert len(summary) == len(want)


def test_without_a_gold_column_reliability_counts_rows_and_says_nothing_of_accuracy(tmp_path):
    job, inst, res, keys = _run(tmp_path, gold_column=None)
    md = _analytics(job, inst, res)
    want = _expected_reliability(_labeled(job, keys))
    got = _query(job, "SELECT bucket, rows, correct, accuracy, mean_confidence FROM reliability")
    assert [g[:4] for g in got] == [(b, n, None, None) for b, n, _, _ in want]
    assert [g[4] for g in got] == pytest.approx([w[3] for w in want], abs=1e-4)
    assert "reliability" not in md and "reliability_summary" not in md
    assert md["review_rows"].value == len(_query(job, "FROM review")) > 0


def test_each_partition_carries_its_confidence_histogram(tmp_path):
    # Texts over 33 characters are error rows: they have no confidence and count in no bucket.
    job, inst, res, keys = _run(tmp_path, max_input_chars=33)
    version = job.current_version()
    records = inst.fetch_materializations(job.keys["labeled_outputs"], limit=100).records
    by_partition = {r.partition_key: r.asset_materialization.metadata for r in records}
    assert sorted(by_partition) == keys
    errors = 0
    for k in keys:
        rows = pq.read_table(job.home.labeled_path(version, k)).to_pylist()
        sure = [r["confidence"] for r in rows if r["confidence"] is not None]
        assert all(r["confidence"] is None for r in rows if r["error"] is not None)
        errors += sum(r["error"] is not None for r in rows)
        want = {f"{b / 10:.1f}-{(b + 1) / 10:.1f}": sum(_bucket(c) == b for c in sure) for b in range(10)}
        md = by_partition[k]
        assert md["confidence_histogram"].value == want
        assert sum(want.values()) == len(sure) == md["labeled"].value
        assert md["confidence_mean"].value == pytest.approx(sum(sure) / len(sure), abs=1e-4)
    assert 0 < errors < 150
    stats = json.loads(job.home.stats_path(version, keys[0]).read_text())
    assert len(stats["confidence_histogram"]) == 10


def test_files_written_before_confidences_were_kept_still_read(tmp_path):
    job, inst, res, keys = _run(tmp_path)
    version = job.current_version()
    rows = _labeled(job, keys)

    def drop_confidence(key: str) -> None:  # the file as an older release wrote it
        path = job.home.labeled_path(version, key)
        table = pq.read_table(path)
        pq.write_table(table.drop_columns(["confidence", "raw_confidence", "model_output", "reviewed_by",
                                           "reviewed_at"]), path)
        # ...with its stats as that release wrote them: no sha256 of the file (checked on its rows).
        stats = job.home.stats_path(version, key)
        old = {k: v for k, v in json.loads(stats.read_text()).items() if not k.startswith("labeled_")}
        stats.write_text(json.dumps(old))

    drop_confidence(keys[0])
    old = {r["row_id"] for r in pq.read_table(job.home.labeled_path(version, keys[0])).to_pylist()}
    facts = metrics.analytics(job.spec, job.home, version)
    newer = [r for r in rows if r["row_id"] not in old]
    assert _query(job, "SELECT count(*) FROM labeled WHERE confidence IS NULL")[0][0] == len(old) > 0
    assert _query(job, "SELECT confidence, row_id FROM review") == sorted(
        (r["confidence"], r["row_id"]) for r in newer if r["confidence"] < 0.5)
    assert _query(job, "SELECT bucket, rows, correct FROM reliability") == [w[:3] for w in _expected_reliability(newer)]
    assert facts.rows == 150 and facts.confidence is not None and facts.confidence.rows == len(newer)

    for k in keys[1:]:  # none of the files has the column
        drop_confidence(k)
    facts = metrics.analytics(job.spec, job.home, version)
    assert facts.rows == 150 and facts.confidence is None and facts.reliability is None
    assert _query(job, "SELECT count(*) FROM review") == [(0,)]
    assert _query(job, "SELECT count(*) FROM reliability") == [(0,)]
    assert _analytics(job, inst, res)["rows"].value == 150  # the asset too


@pytest.mark.parametrize("value", [0, -0.1, 1.5, float("nan")])
def test_a_review_below_outside_0_1_names_the_value_and_the_fix(tmp_path, value):
    with pytest.raises(ConfigError, match=r"review_below=.* must be above 0 and at most 1: a confidence, e\.g\. 0\.5"):
        make_spec(tmp_path, review_below=value)
    assert make_spec(tmp_path, review_below=1).review_below == 1.0


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}", shard_count=2, home={home!r},
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), review_below={below!r})
# No gold column: the views show the model's own confidences (nothing to calibrate them on).
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource()}})
"""


def _cli(tmp_path: Path, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout))


def test_sparkbatch_sql_from_review_and_reliability(tmp_path):
    src = make_spec(tmp_path, n=90).input
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=src, home=str(tmp_path / "home"), below=0.4))
    _cli(tmp_path, "run", "-f", str(defs))
    labeled = [r for f in (tmp_path / "home" / "out").rglob("labeled/*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(labeled) == 90
    review = _cli(tmp_path, "sql", "-f", str(defs), "SELECT row_id, confidence FROM review")
    assert review["columns"] == ["row_id", "confidence"]
    want = sorted((r["confidence"], r["row_id"]) for r in labeled if r["confidence"] < 0.4)
    assert [(c, i) for i, c in review["rows"]] == want and want
    table = _cli(tmp_path, "sql", "-f", str(defs), "SELECT sum(rows), count(*) FROM reliability")
    assert table["rows"][0][0] == 90 and table["rows"][0][1] == len({_bucket(r["confidence"]) for r in labeled})


def test_review_below_travels_from_a_defs_yaml(tmp_path, monkeypatch):
    src = make_spec(tmp_path).input
    monkeypatch.setenv("REVIEW_AT", "0.3")

    def load(below: str) -> Any:
        text = textwrap.dedent(f"""
            type: sparkbatch_dagster.BatchInferenceComponent
            attributes:
              name: things
              input: {src}
              text_columns: [text]
              user_template: "What is this? {{{{ text }}}}"
              output: {{kind: label, labels: [fruit, vehicle, animal]}}
              review_below: {below}
        """)
        return yaml_job_spec(text).review_below

    assert load("0.2") == 0.2
    assert load("\"{{ env('REVIEW_AT') }}\"") == 0.3
    with pytest.raises(Exception) as info:
        load("1.5")
    chain, exc = [], info.value
    while exc is not None:  # dagster wraps the component's own error
        chain.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    assert "defs.yaml:9: attributes.review_below: review_below=1.5 must be above 0 and at most 1" in "\n".join(chain)
