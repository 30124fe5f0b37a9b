"""Calibration and the review budget on a finished job's gold rows: ECE and Brier score before and
after (held-out folds), and the share of errors caught at 5, 10 and 20% of rows reviewed.

    python -m benchmarks.labels.calibration -f definitions.py --out benchmarks/results/calibration-cpu-smollm2.json
    python -m benchmarks.labels.calibration -f definitions.py --job debian_sections --folds 5
    python -m benchmarks.labels.calibration --rows-file gold.parquet      # columns: confidence, correct (, model)
    python -m benchmarks.labels.calibration -f definitions.py --unseen 0.5   # the queue on rows the maps never saw

The rows are the committed ``labeled`` rows of the job's current version whose truth is known (a
reviewer's label, else the gold column) and whose answer had a confidence: the model's own
(``raw_confidence``), right when the model's own answer is the truth, read as a user would:
``sparkbatch sql -f FILE "..."`` in its own process (the job must have run: ``sparkbatch run -f FILE``).
``--rows-file`` reads them from a Parquet, CSV or JSONL file instead. Per model identity (a cascade's
rows are each their answering model's): the chosen calibration method and every candidate's held-out
Brier score (``estimate/calibration.py``), the reliability tables before and after, and, on the raw
and on the calibrated (held-out) confidences, the review-budget plans of ``estimate/review_budget.py``:
errors caught at each ``--budgets`` share and rows reviewed for each ``--catch`` target, held out, with
95% Wilson intervals. Held out all the way: the method is chosen inside each fold (nested).

``--unseen 0.5`` measures what a team acts on (:func:`queue_on_unseen`): half the rows keep their truth,
the maps and plans are made on those, the queue takes its budget of every row, and the errors it
catches are counted on the hidden half, against the plan's claim.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[2]

# The model's own confidence and answer (the views show a calibrated confidence and a reviewer's label
# over the model's), right against the truth: a reviewer's label, else the gold column.
QUERY = ("SELECT row_id, raw_confidence AS confidence, model_correct AS correct, model, "
         "coalesce(model_output, output) AS output, truth AS gold FROM labeled "
         "WHERE raw_confidence IS NOT NULL AND model_correct IS NOT NULL ORDER BY row_id")  # same folds each run


def from_job(file: str, job: str | None) -> list[dict[str, Any]]:
    """The gold rows, through ``sparkbatch sql`` in its own process (its stdout's last line is JSON)."""
    exe = shutil.which("sparkbatch", path=str(Path(sys.executable).parent)) or "sparkbatch"
    cmd = [exe, "sql", "-f", file, *(["--job", job] if job else []), QUERY]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"calibration: `{' '.join(cmd[:-1])} QUERY` failed: {proc.stderr.strip()[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return [dict(zip(got["columns"], r, strict=True)) for r in got["rows"]]


def from_file(path: str) -> list[dict[str, Any]]:
    """Rows with ``confidence`` and ``correct`` (and optionally ``model``) from a Parquet/CSV/JSONL file."""
    import duckdb

    rel = duckdb.sql(f"FROM '{path.replace(chr(39), chr(39) * 2)}'")
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


def judge(conf: Any, right: Any, labels: list[str], model: str, folds: int, budgets: list[float],
          catch: list[float], chart: Path | None) -> dict[str, Any]:
    """Calibration and budget plans of one model's gold rows, as plain JSON."""
    import numpy as np

    from sparkbatch_dagster.estimate import calibration as cal
    from sparkbatch_dagster.estimate import review_budget as rb

    report = cal.calibrate(conf, right, model=model, labels=labels, folds=folds)
    held = np.asarray(report.held_out)  # nested: map and method chosen without the row
    if chart:
        from sparkbatch_dagster.estimate.review_chart import write_review_chart

        write_review_chart(report, rb.budget_curve(held, right, conf), chart, title=model)
    out: dict[str, Any] = {
        "model": model, "gold_rows": int(len(conf)), "accuracy": round(float(right.mean()), 4),
        "method": report.calibration.method, "why": report.calibration.reason,
        "before": dataclasses.asdict(report.before), "after_held_out": dataclasses.asdict(report.after),
        "candidates_held_out": {c.method: dataclasses.asdict(c.held_out) for c in report.candidates},
        "reliability_before": [dataclasses.asdict(b) for b in report.reliability_before],
        "reliability_after_held_out": [dataclasses.asdict(b) for b in report.reliability_after],
        "calibration": report.calibration.model_dump(),
    }
    scales = {"raw": conf}
    if report.calibration.method != "none":
        scales["calibrated_held_out"] = held
    for name, c in scales.items():
        if len(c) < rb.MIN_ROWS:
            out[f"review_{name}"] = f"{len(c)} gold rows: a plan needs {rb.MIN_ROWS}"
            continue
        plans = [rb.plan_budget(c, right, b, folds, raw=conf) for b in budgets]
        if (~right).sum() >= folds:
            plans += [rb.plan_catch_errors(c, right, t, folds, raw=conf) for t in catch]
        out[f"review_{name}"] = [plan_json(p) for p in plans]
        out[f"in_sample_curve_{name}"] = {f"{b:g}": round(rb.budget_curve(c, right, conf).caught_at(b), 4)
                                         for b in budgets}
    return out


def plan_json(plan: Any) -> dict[str, Any]:
    """A review plan as plain JSON (its shares are msgspec records)."""
    import msgspec

    return {f.name: msgspec.structs.asdict(getattr(plan, f.name)) if f.name in ("reviewed", "caught")
            else getattr(plan, f.name) for f in dataclasses.fields(plan)}


def queue_on_unseen(rows: list[dict[str, Any]], labels: list[str], budgets: list[float], unseen: float, folds: int,
                    seed: int) -> dict[str, Any]:
    """What a team sees: a random ``1 - unseen`` of the rows keep their truth (the gold rows), the rest
    hide it. Each model is calibrated on its gold rows and each budget planned on them (as analytics
    does); the queue is the rank cut of EVERY row (calibrated, then raw confidence, then row id, as the
    ``review`` view ranks); the errors it catches are counted on the hidden rows, which neither the maps
    nor the plans saw, against the plan's claim and its 95% interval."""
    import msgspec
    import numpy as np

    from sparkbatch_dagster.estimate import calibration as cal
    from sparkbatch_dagster.estimate import review_budget as rb

    rows = sorted(rows, key=lambda r: str(r["row_id"]))
    n = len(rows)
    gold = np.random.default_rng(seed).permutation(n) >= round(unseen * n)
    model = np.array([str(r.get("model") or "unknown") for r in rows])
    raw = np.array([float(r["confidence"]) for r in rows])
    right = np.array([bool(r["correct"]) for r in rows])
    calibrated, held = raw.copy(), raw.copy()
    for m in sorted(set(model)):
        mine = model == m
        report = cal.calibrate(raw[mine & gold], right[mine & gold], model=m, labels=labels, folds=folds)
        calibrated[mine] = report.calibration.apply(raw[mine])
        held[mine & gold] = report.held_out
    order = rb.order(calibrated, raw)  # rows are in row-id order: the view's last tie-break
    hidden_wrong = ~gold & ~right
    out = []
    for b in budgets:
        plan = rb.plan_budget(held[gold], right[gold], b, folds, raw=raw[gold])
        sent = np.zeros(n, bool)
        sent[order[:rb.cut(b, n)]] = True
        caught = int((sent & hidden_wrong).sum())
        value = caught / int(hidden_wrong.sum()) if hidden_wrong.any() else 0.0
        out.append({"budget": b, "rows_queued": int(sent.sum()), "rows": n, "hidden_rows": int((~gold).sum()),
                    "hidden_errors": int(hidden_wrong.sum()), "caught_on_hidden": caught,
                    "caught_on_hidden_share": round(value, 4), "claimed": msgspec.structs.asdict(plan.caught.rounded()),
                    "inside_claim": plan.caught.low <= value <= plan.caught.high})
    truth = [r for r in rows if r.get("gold") is not None]
    return {"unseen_share": unseen, "seed": seed, "gold_rows": int(gold.sum()),
            "accuracy": round(sum(bool(r["correct"]) for r in truth) / len(truth), 4) if truth else None,
            "accuracy_rows": len(truth), "budgets": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("-f", "--file", help="the definitions file of a job that has run")
    src.add_argument("--rows-file", help="Parquet/CSV/JSONL with columns confidence, correct (, model)")
    ap.add_argument("--job", help="job name, when the file defines several")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--budgets", default="0.05,0.1,0.2", help="shares of rows reviewed")
    ap.add_argument("--catch", default="0.5,0.8", help="shares of errors to catch")
    ap.add_argument("--machine", default="cpu", help="where the job ran (the result file says so)")
    ap.add_argument("--out")
    ap.add_argument("--chart", help="a PNG per model: the reliability diagram and the budget curve (<stem>-<n>.png)")
    ap.add_argument("--unseen", type=float, default=0.0,
                    help="also hide the truth of this share of rows (e.g. 0.5; rows need row_id): calibrate and plan "
                         "on the rest, queue every row, count the errors caught on the hidden rows")
    ap.add_argument("--seed", type=int, default=0, help="which rows --unseen hides")
    ap.add_argument("--run-line", help="the job's `sparkbatch run` stdout: its JSON line's accuracy (over the rows "
                                       "with a gold value) and review queue are kept in the result")
    args = ap.parse_args()
    import numpy as np

    rows = from_job(args.file, args.job) if args.file else from_file(args.rows_file)
    budgets = [float(x) for x in args.budgets.split(",")]
    catch = [float(x) for x in args.catch.split(",")]
    labels = sorted({str(r[k]) for r in rows for k in ("output", "gold") if r.get(k) is not None})
    models = sorted({str(r.get("model") or "unknown") for r in rows})
    per_model = []
    for i, m in enumerate(models):
        mine = [r for r in rows if str(r.get("model") or "unknown") == m]
        conf = np.array([float(r["confidence"]) for r in mine])
        right = np.array([bool(r["correct"]) for r in mine])
        chart = Path(args.chart).with_name(f"{Path(args.chart).stem}-{i}.png") if args.chart else None
        per_model.append(judge(conf, right, labels, m, args.folds, budgets, catch, chart))
    result = {"benchmark": "calibration", "machine": args.machine, "code": commit_of(ROOT),
              "command": " ".join(["benchmarks/labels/calibration.py", *sys.argv[1:]]),
              "source": args.file or args.rows_file, "job": args.job,
              "folds": args.folds, "rows": len(rows), "labels": labels, "models": per_model}
    if args.unseen:
        result["queue_on_unseen"] = queue_on_unseen(rows, labels, budgets, args.unseen, args.folds, args.seed)
    if args.run_line:
        line = json.loads(next(t for t in reversed(Path(args.run_line).read_text().splitlines()) if t.startswith("{")))
        keep = ("rows", "errors", "accuracy", "accuracy_rows", "accuracy_after_review", "review_rows", "review_share",
                "calibration", "version")
        result["run"] = {k: line.get(k) for k in keep}
    emit(result, args.out)


if __name__ == "__main__":
    main()
