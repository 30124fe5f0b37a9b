"""The review, end to end on the fake engine and a real Dagster instance: analytics calibrates on the
gold rows and plans ``review: {budget: 0.1}`` (the least sure 10% of rows); ``review_queue`` lists
them; ``human_labels``' blocking check holds a downstream asset back until every queued row has a
reviewer's label, and the asset then reads the reviewers' labels through the IO manager; the
reviewer's label overrides the model's in the views (with who and when),
is gold for the next calibration, and a later version's run writes it over the answer the result
store hands back, while the store keeps the model's own. Expected values come from the files."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from dagster import AssetIn, AssetKey, DagsterInstance, asset, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.run import human_labels
from sparkbatch_dagster.run.result_store import ResultStore
from sparkbatch_dagster.run.review_queue import load_threshold
from testkit import fake_resource, label_then_metrics, make_rows, make_spec, write_parquet

LABELS = ["fruit", "vehicle", "animal"]
#: The fake model knows two words of each label (answers them right, fairly sure) and guesses the third
#: as surely: overconfident, yet its confidence ranks right above wrong, as a real model's does.
KNOWS = {"apple": "fruit", "banana": "fruit", "car": "vehicle", "truck": "vehicle", "dog": "animal", "cat": "animal"}


def _all(job: Any, res: dict[str, Any], inst: Any) -> list[str]:
    assert materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst).success
    keys = sorted(inst.get_dynamic_partitions(job.partitions_def.name))
    labeled, measured = label_then_metrics(job.assets, job.keys, res, inst, keys[0], keys[-1])
    assert labeled.success and measured.success
    return keys


def _md(result: Any, node: str) -> dict[str, Any]:
    return {k: v.value for k, v in result.asset_materializations_for_node(node)[0].metadata.items()}


def _query(job: Any, sql: str) -> list[tuple]:
    with duckdb.connect(str(job.home.metrics_db), read_only=True) as con:
        return con.execute(sql).fetchall()


def _files(job: Any, keys: list[str]) -> dict[str, dict[str, Any]]:
    version = job.current_version()
    return {r["row_id"]: r for k in keys for r in pq.read_table(job.home.labeled_path(version, k)).to_pylist()}


def test_budget_queue_check_and_a_reviewers_label_over_the_models(tmp_path: Path):
    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(150))
    spec = make_spec(tmp_path, input=str(src), shards=3, review={"budget": 0.1})
    job = build_batch_assets(spec=spec)
    inst = DagsterInstance.get()
    fake, engine = fake_resource(knows=KNOWS)
    res = {"vllm": fake}
    keys = _all(job, res, inst)
    first = job.current_version()
    gold = {r["id"]: r["gold"] for r in make_rows(150)}

    seen: dict[str, tuple[str, float]] = {}

    @asset(deps=[job.keys["human_labels"]], ins={"labeled": AssetIn(key=job.keys["labeled_outputs"])})
    def reviewed_report(labeled: Any) -> None:
        """A downstream asset that must wait for reviewed rows: the README's pattern, after human_labels."""
        seen.update({r["row_id"]: (r["output"], r["confidence"]) for r in labeled.to_pylist()})

    assets = [*job.assets, reviewed_report]
    result = materialize(assets, selection=[job.keys["analytics"], job.keys["review_queue"]], resources=res,
                         instance=inst)
    assert result.success
    md = _md(result, "things__analytics")
    # Calibrated on the 150 gold rows: a map fitted for the fake's model, stored, with its scores.
    stored = list(job.home.calibration_dir.glob("*.json"))
    assert len(stored) == 1 and "ece_before" in md["calibration"] and "brier_after" in md["calibration"]
    cal = json.loads(stored[0].read_text())
    rows = _files(job, keys)
    assert cal["model"] == next(iter(rows.values()))["model"] and cal["rows"] == 150
    assert cal["model"] in md["calibration"] and md["gold_rows"] == 150
    # Its chart is shown in place: the PNG itself inline in the Markdown, not only a path on this box.
    [chart] = [Path(v) for k, v in md.items() if k.startswith("calibration_chart_")]
    [shown] = [v for k, v in md.items() if k.startswith("reliability and budget ")]
    inline = base64.b64decode(re.fullmatch(r"!\[[^]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", shown)[1])
    assert inline[:8] == b"\x89PNG\r\n\x1a\n" and inline == chart.read_bytes()
    # The budget is a share of rows: exactly 10% of them go to review, least sure first.
    plan = load_threshold(job.home)
    assert plan is not None and (plan.asked, plan.target, plan.share) == ("budget", 0.1, 0.1) and plan.gold_rows == 150
    assert md["review_share"] == 0.1
    assert "errors caught" in md["review_plan"] and "95% interval" in md["review_plan"]
    queued = _query(job, "SELECT row_id, confidence FROM review")
    assert len(queued) == 15
    least = _query(job, "SELECT row_id FROM labeled ORDER BY confidence, raw_confidence, row_id LIMIT 15")
    assert [r for r, _ in queued] == [r for (r,) in least]
    q = _md(result, "things__review_queue")
    assert q["queue_rows"] == len(queued) and q["queue_cut"] == "least sure 0.1 of rows"

    # Nothing reviewed yet: the blocking check fails and the downstream asset does not run.
    held = materialize(assets, selection=[job.keys["human_labels"], AssetKey("reviewed_report")], resources=res,
                       instance=inst, raise_on_error=False)
    checks = held.get_asset_check_evaluations()
    assert [c.passed for c in checks] == [False]
    assert checks[0].metadata["rows_waiting_for_review"].value == len(queued)
    assert not held.asset_materializations_for_node("reviewed_report")

    # A reviewer labels every queued row: the gold label, except one row called "animal" on purpose.
    ids = [r for r, _ in queued]
    said = {r: gold[r] for r in ids}
    said[ids[0]] = "animal" if gold[ids[0]] != "animal" else "fruit"
    found = [human_labels.HumanLabel.of(r, lab, "ann@example.com", "2026-12-06T10:00:00+00:00",
                                        f"label-studio:1/{i}/{i}", LABELS) for i, (r, lab) in enumerate(said.items())]
    assert human_labels.merge(job.home, found, LABELS).added == len(ids)
    done = materialize(assets, selection=[job.keys["human_labels"], AssetKey("reviewed_report")], resources=res,
                       instance=inst)
    assert [c.passed for c in done.get_asset_check_evaluations()] == [True]
    assert done.asset_materializations_for_node("reviewed_report")
    # What it read: every reviewer's label, and the confidence the views show (calibrated)
    assert {r: seen[r][0] for r in ids} == said
    shown = dict(_query(job, "SELECT row_id, confidence FROM labeled"))
    assert {r: c for r, (_, c) in seen.items()} == pytest.approx(shown)
    hl = _md(done, "things__human_labels")
    assert hl["human_labels"] == hl["reviewed_rows"] == len(ids)
    assert hl["corrected_rows"] == sum(said[r] != rows[r]["output"] for r in ids)
    # The views: the reviewer's label, the model's kept apart, who and when; nothing left to review.
    sql = "SELECT row_id, output, model_output, reviewed_by, reviewed_at FROM labeled WHERE reviewed_by IS NOT NULL"
    got = {r: (o, m, by, at) for r, o, m, by, at in _query(job, sql)}
    assert got == {r: (said[r], rows[r]["output"], "ann@example.com", "2026-12-06T10:00:00.000000+00:00") for r in ids}
    assert _query(job, "SELECT count(*) FROM review") == [(0,)]
    # The corrected rows are gold now: the model's answer against the reviewer's label, not the column.
    truth = dict(_query(job, f"SELECT row_id, model_correct FROM labeled WHERE row_id = '{ids[0]}'"))
    assert truth[ids[0]] == (rows[ids[0]]["output"] == said[ids[0]])

    # A later version (10 rows appended): the result store hands the model's old answers back, and the
    # run writes the reviewer's label over them; only the new prompts are generated.
    write_parquet(src, make_rows(160))
    job2 = build_batch_assets(spec=make_spec(tmp_path, input=str(src), shards=3, review={"budget": 0.1}))
    fake2, engine2 = fake_resource(knows=KNOWS)
    keys2 = _all(job2, {"vllm": fake2}, inst)
    assert job2.current_version() != first and 0 < engine2.requests_seen <= 10
    again = _files(job2, keys2)
    # Each partition says which calibration its confidences were written with, and how well it does.
    now = json.loads(stored[0].read_text())
    event = inst.get_latest_materialization_event(job2.keys["labeled_outputs"])
    assert event is not None and event.asset_materialization is not None
    table = event.asset_materialization.metadata["calibration"].value
    assert f"| {now['model']} | {now['method']} | {now['rows']} | {now['ece_before']} -> {now['ece_after']} |" in table
    for r in ids:
        assert again[r]["reused"] and again[r]["output"] == said[r]
        assert again[r]["model_output"] == rows[r]["output"] and again[r]["reviewed_by"] == "ann@example.com"
    # ...and the store still holds the model's own answer and raw confidence, never the reviewer's.
    store = ResultStore(job2.spec.result_store_path, job2.spec.answer_context(fake2.model_identity()))
    answer = store.lookup([rows[ids[0]]["prompt_key"]])[rows[ids[0]]["prompt_key"]]
    assert answer[0] == rows[ids[0]]["output"] and answer[2] == rows[ids[0]]["raw_confidence"]


DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns=["text"],
               user_template="What is this? {{{{ text }}}}", shard_count=2, gold_column="gold", home={home!r},
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), review={{"budget": 0.1}})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": FakeVLLMResource(knows={knows!r})}})
"""


def test_sparkbatch_run_says_what_was_calibrated_and_how_many_rows_wait_for_review(tmp_path: Path):
    import os
    import subprocess
    import sys

    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(120))
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=str(src), home=str(tmp_path / "home"), knows=KNOWS))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(defs)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    home = tmp_path / "home"
    (stored,) = [json.loads(p.read_text()) for p in (home / "calibration").glob("*.json")]
    assert line["calibration"] == {stored["model"]: {k: stored[k] for k in (
        "method", "rows", "ece_before", "ece_after", "brier_before", "brier_after")}}
    assert stored["rows"] == 120 and stored["ece_after"] < stored["ece_before"]
    plan = json.loads((home / "review" / "threshold.json").read_text())
    assert plan["share"] == line["review_share"] == 0.1 and line["review_rows"] == 12
    assert "review_threshold" not in line  # a share, one number: no threshold that ties could move
    # Accuracy is the model's own over the rows with a gold value, said with how many
    assert line["accuracy_rows"] == 120 and line["accuracy_after_review"] == line["accuracy"]
    # The run published the queue: its 12 rows stay queued until reviewed
    import pyarrow.parquet as pq

    (queue,) = (home / "review" / "queue").glob("*.parquet")
    assert pq.read_table(queue).num_rows == 12
