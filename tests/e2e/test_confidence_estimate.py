"""The estimate's reliability table: with a gold column, each model's accuracy per confidence
bucket on the sample (report, asset metadata, advice); without one, none. Expected values come
from the labeled files of a full run on the same fake engine (same prompt, same answer and
confidence), for the rows the sample drew."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.sample import Sample, Timing, draw_sample, merge
from sparkbatch_dagster.spec import EstimateSpec
from sparkbatch_dagster.testing import FakeVLLMResource
from testkit import label_then_metrics, make_spec

#: No time floor, no growth (a bar of 0 is cleared at once), no batch fill: the sample is 40 rows.
EST = EstimateSpec(sample_rows=40, warmup_rows=4, fill_batch=False, min_sample_seconds=0, accuracy_bar=0.0,
                   sample_hardware="dgx-spark")


def _estimate(tmp_path, **overrides: Any) -> tuple[Any, Any, dict[str, Any], Any]:
    """The job, its instance, the estimate asset's metadata and the report."""
    job = build_batch_assets(spec=make_spec(tmp_path, n=200, shards=2, estimate=EST, **overrides))
    inst = DagsterInstance.get()
    res = {"vllm": FakeVLLMResource()}
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]], resources=res,
                         instance=inst)
    assert result.success
    md = result.asset_materializations_for_node("things__estimate")[0].metadata
    return job, inst, res, md


def test_with_gold_the_estimate_shows_accuracy_per_confidence_bucket(tmp_path):
    job, inst, res, md = _estimate(tmp_path)
    report = json.loads(Path(md["report"].value).read_text())
    model = report["models"][0]
    assert model["sample_rows"] == 40
    # The sample's rows, labeled by a full run on the same engine: their confidences and answers.
    sampled = {r["row_id"] for r in draw_sample(job.spec, job.home, EST).rows}
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    assert label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])[0].success
    version = job.current_version()
    gold = {r["id"]: r["gold"] for r in pq.read_table(job.spec.input).to_pylist()}
    rows = [r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()
            if r["row_id"] in sampled]
    assert len(rows) == 40
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        # The estimate's table is of the model's own confidence: the run writes it as raw_confidence
        # (its confidence is calibrated by the map the estimate fitted on the sample).
        b = min(int(Decimal(str(r["raw_confidence"])) * 10), 9)
        by.setdefault(f"{b / 10:.1f}-{(b + 1) / 10:.1f}", []).append(r)
    want = [(name, len(rs), sum(r["output"] == gold[r["row_id"]] for r in rs)) for name, rs in sorted(by.items())]
    assert len(want) >= 4
    assert [(b["bucket"], b["rows"], b["correct"]) for b in model["reliability"]] == want
    assert sum(b["correct"] for b in model["reliability"]) == model["sample_correct"]
    table = md["reliability"].value
    for name, n, correct in want:
        assert f"| fake-model | {name} | {n} | {correct} | {round(correct / n, 4)} |" in table
    top = want[-1]
    line = next(a for a in report["advice"] if "confidence against the gold column" in a)
    assert f"confidence {top[0]}: right {top[2] / top[1]:.0%} of the time ({top[1]} rows" in line


def test_without_gold_the_estimate_has_no_reliability(tmp_path):
    _, _, _, md = _estimate(tmp_path, gold_column=None)
    report = json.loads(Path(md["report"].value).read_text())
    assert report["models"][0]["reliability"] is None and "reliability" not in md
    assert not any("confidence against the gold column" in a for a in report["advice"])


def test_merged_draws_keep_every_rows_confidence_and_no_gold_means_no_table():
    a = Timing("m", 1.0, 2.0, 2, 10, 2, 0, correct=1, by_row={"r1": (0.95, True), "r2": (0.15, False)})
    b = Timing("m", 1.0, 2.0, 1, 5, 1, 0, correct=1, by_row={"r3": (0.97, True), "r4": (None, False)})
    both = merge(a, b, first_rows=2)
    assert both.sure == [(0.95, True), (0.15, False), (0.97, True)]
    sample = Sample(rows=[], warmup=[], total_rows=100, distinct_prompts=100)
    table = predict(sample, both, [], None).reliability
    assert [(t["bucket"], t["rows"], t["correct"]) for t in table] == [("0.1-0.2", 1, 0), ("0.9-1.0", 2, 2)]
    no_gold = Timing("m", 1.0, 2.0, 2, 10, 2, 0, correct=None, by_row={"r1": (0.95, True)})
    assert predict(sample, no_gold, [], None).reliability is None
