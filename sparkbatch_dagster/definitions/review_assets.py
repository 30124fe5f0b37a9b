"""The review as Dagster assets: after ``analytics``, the rows a person should check
(``review_queue``) and what people said of them (``human_labels``), so a downstream asset can wait
for "reviewed" rather than "labeled".

    analytics -> review_queue -> human_labels (check: review_complete, blocking)

``analytics`` first learns from the gold rows (``estimate/gold_fit.py``: each model's calibration,
an error target turned into a share of rows) and then refreshes the views with them. ``review_queue``
records the rows the cut in force selects as queued for good (``run/review_members.py``) and reports
the queue. ``human_labels`` reads the reviewers' labels imported from the annotation tool (``sparkbatch
review import``, which materializes it), learns from them again (a corrected row is gold for the next
calibration) and refreshes the views; its blocking check ``review_complete`` passes once every queued
row has a reviewer's label or was dismissed, so an asset that depends on ``human_labels`` runs on
reviewed rows only.

Example::

    @asset(deps=[job.keys["human_labels"]])
    def reviewed_report(duckdb: DuckDBResource): ...
"""


from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    AutomationCondition,
    MaterializeResult,
    MetadataValue,
    asset,
)

from ..errors import SparkbatchError
from ..estimate.gold_fit import GoldFit, fit_on_gold
from ..run import human_labels, metrics, review_members
from ..run.query import read_only
from ..run.review_marks import job_labels
from ..run.review_queue import threshold_of
from ..run.review_store import heal
from ..spec import JobSpec
from .job import BatchJob
from .metadata import md_table, picture

REVIEW_COMPLETE = "review_complete"


def learns(spec: JobSpec) -> bool:
    """Whether the job's answers carry a confidence to calibrate and review by."""
    return spec.output.kind != "text" and spec.output.confidence


def refresh(job: BatchJob, version: str) -> tuple[GoldFit | None, Any]:
    """Learn from the gold rows (when answers have confidences), then refresh the views with what
    was learnt: (the fit, the analytics headline). The caller refreshed the home (``JobHome.refresh``
    brings the labels imported and calibrations fitted on another box): what is damaged is set aside."""
    heal(job.home)
    fit = fit_on_gold(job.spec, job.home, version) if learns(job.spec) else None
    return fit, metrics.analytics(job.spec, job.home, version)


def fit_metadata(fit: GoldFit | None) -> dict[str, Any]:
    """Calibration (ECE and Brier before and after, held out, per model, with its chart shown in place), the
    budget curve's errors caught at 5/10/20% of rows reviewed and the review plan with its intervals."""
    if fit is None:
        return {}
    if not fit.rows:
        return {"calibration": MetadataValue.text(fit.why)}
    table = [{"model": f.model, "method": f.report.calibration.method, "gold_rows": f.report.calibration.rows,
              "ece_before": round(f.report.before.ece, 4), "ece_after": round(f.report.after.ece, 4),
              "brier_before": round(f.report.before.brier, 4), "brier_after": round(f.report.after.brier, 4),
              "why": f.report.calibration.reason} for f in fit.models]
    out: dict[str, Any] = {"calibration": MetadataValue.md(md_table(table, list(table[0]))),
                           "gold_rows": fit.rows,
                           "errors_caught_at_share_reviewed": MetadataValue.json(fit.caught_at())}
    for f in fit.models:
        if f.chart is not None:
            short = f.model.split("@")[0].rsplit("/", 1)[-1]
            out[f"calibration_chart_{short}"] = MetadataValue.path(str(f.chart))
            out.update(picture(f.chart, f"reliability and budget {short}"))
    if fit.plan is not None:
        p = fit.plan
        other = p.caught if p.asked == "budget" else p.reviewed
        what = "errors caught" if p.asked == "budget" else "rows reviewed"
        out["review_plan"] = MetadataValue.text(
            f"review {p.asked}={p.target:g} -> the least sure {p.share:.1%} of rows: {what} {other.value:.1%} "
            f"(95% interval {other.low:.1%}-{other.high:.1%}, held out: maps and method chosen without the rows "
            f"scored, over {p.folds} folds of {p.rows} gold rows)")
        out["review_share"] = round(p.share, 6)
    elif fit.why:
        out["review_plan"] = MetadataValue.text(fit.why)
    return out


def build_review_assets(job: BatchJob, io: dict[str, Any], group: str) -> list[AssetsDefinition]:
    """``review_queue`` and ``human_labels`` (with its ``review_complete`` check) of ``job``."""
    spec, home = job.spec, job.home

    @asset(key=job.keys["review_queue"], deps=[job.keys["analytics"]], group_name=group, kinds={"duckdb"}, **io,
           automation_condition=AutomationCondition.eager(),
           description="The rows a person should check: the least sure share of rows (review.budget, or "
                       "review.catch_errors turned into one on the gold rows; calibrated confidence), else "
                       "confidence under review_below; a queued row stays until reviewed or dismissed. "
                       "`sparkbatch review export` sends them to Label Studio.")
    def review_queue(context: AssetExecutionContext) -> MaterializeResult:
        home.refresh()
        version = job.current_version()
        publish_queue(job, version, "review_queue")
        return MaterializeResult(metadata=_queue_metadata(job, version))

    @asset(key=job.keys["human_labels"], deps=[review_queue], group_name=group, kinds={"duckdb"}, **io,
           check_specs=[AssetCheckSpec(REVIEW_COMPLETE, asset=job.keys["human_labels"], blocking=True,
                                       description="Every row in the review queue has a reviewer's label: an "
                                                   "asset downstream of human_labels runs on reviewed rows.")],
           description="The reviewers' labels (imported by `sparkbatch review import`): they override the "
                       "model's label in the output, with who and when, and are gold for the next calibration.")
    def human_labels_asset(context: AssetExecutionContext) -> Iterator[Any]:
        home.refresh()
        version = job.current_version()
        people = human_labels.load(home, job_labels(spec))
        publish_queue(job, version, "human_labels")  # what the cut in force queued stays queued after the refit
        fit, _ = refresh(job, version)  # the corrected rows are gold now: calibrate and refresh the views
        queue = _queue_metadata(job, version)
        yield MaterializeResult(metadata={"human_labels": len(people), **_corrections(job, version),
                                          **{k: v for k, v in queue.items() if k.startswith("queue")},
                                          **fit_metadata(fit)})
        waiting = int(queue["queue_rows"])
        yield AssetCheckResult(check_name=REVIEW_COMPLETE, passed=waiting == 0, severity=AssetCheckSeverity.ERROR,
                               metadata={"rows_waiting_for_review": waiting, "human_labels": len(people)},
                               description=None if waiting == 0 else
                               f"{waiting} queued row(s) have no reviewer's label and were not dismissed: "
                               "`sparkbatch review export`, review them, `sparkbatch review import`")

    return [review_queue, human_labels_asset]


def publish_queue(job: BatchJob, version: str, by: str) -> int:
    """Record every row the cut in force selects as queued (:mod:`..run.review_members`), so a later
    cut never drops it; returns how many rows the queue holds (waiting, reviewed or dismissed). Reads
    the cache: the caller refreshes it first (``JobHome.refresh`` pulls the review's files too)."""
    if not job.home.has_commits(version):
        return 0
    with read_only(job.spec, job.home, version) as con:
        ids = [r for (r,) in con.execute("SELECT row_id FROM queued").fetchall()]
    review_members.remember(job.home, ids, "queued", by=by, note=threshold_of(job.spec, job.home).describe())
    return len(ids)


def _queue_metadata(job: BatchJob, version: str) -> dict[str, Any]:
    spec, home = job.spec, job.home
    if not job.home.has_commits(version):
        raise SparkbatchError("no partition is labeled yet: materialize labeled_outputs first")
    t = threshold_of(spec, home)
    with read_only(spec, home, version) as con:
        queued, rows = con.execute("SELECT (SELECT count(*) FROM review), count(confidence) FROM labeled").fetchone()
        states = dict(con.execute("SELECT review_state, count(*) FROM queued GROUP BY ALL").fetchall())
        first = con.execute("SELECT row_id, output, round(confidence, 4) AS confidence FROM review LIMIT 10").fetchall()
    out: dict[str, Any] = {"queue_rows": int(queued), "queue_share": round(queued / rows, 4) if rows else 0.0,
                           "queue_cut": t.describe(), "queue_reviewed": int(states.get("reviewed", 0)),
                           "queue_dismissed": int(states.get("dismissed", 0)),
                           "queue_ever": int(sum(states.values())),
                           "queue_first": MetadataValue.md(md_table(
                               [{"row_id": r, "output": o, "confidence": c} for r, o, c in first],
                               ["row_id", "output", "confidence"]))}
    if t.share is None:
        out["queue_threshold"] = round(t.threshold, 6)
    if t.plan is not None:
        out["queue_expected_errors_caught"] = MetadataValue.json(
            {"value": t.plan.caught.value, "low": t.plan.caught.low, "high": t.plan.caught.high})
    if t.why:
        out["queue_note"] = MetadataValue.text(t.why)
    if spec.cascade:
        out["queue_cascade_note"] = MetadataValue.text(
            "the cascade's `below` compared each stage's raw confidence (what the model said, raw_confidence); "
            "the queue ranks the calibrated confidence the views show")
    return out


def _corrections(job: BatchJob, version: str) -> dict[str, Any]:
    """How many reviewed rows the reviewer changed (the model was wrong) and kept."""
    with read_only(job.spec, job.home, version) as con:
        reviewed, changed = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE model_output IS DISTINCT FROM output) FROM labeled "
            "WHERE reviewed_by IS NOT NULL").fetchone()
    return {"reviewed_rows": int(reviewed), "corrected_rows": int(changed)}
