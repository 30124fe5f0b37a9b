"""What each ``sparkbatch`` command does, callable from Python: ``status``, ``shard``, ``run``,
``run_batch``, ``estimate``, ``sql``, and the run's last line (``summary``). The shell's front end,
arguments in and one JSON line out, is :mod:`.entry`.

Runs go through the Dagster instance in ``$DAGSTER_HOME`` (``./.dagster_home`` when unset), so
what the CLI does shows in ``dagster dev`` and the other way round.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any

from ..definitions.deploy import pool_limit
from ..definitions.factory import BatchJob
from ..definitions.prestart import close_untaken
from ..definitions.resource import VLLMResource
from ..engines.gpu_lock import wait_for_stops
from ..engines.platform.spans import Collected, collecting
from ..run.progress import Bar, listening
from ..run.totals import CostCheck, RunSummary, Status
from . import batch, console
from .early_start import start_engine_early
from .locate import instance

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
#: What the CLI shows of each node option the estimate priced.
OPTION_KEYS = ("name", "nodes", "gpus_per_node", "engines", "hardware", "speed_basis", "wall_s", "wall_low_s",
               "cost_usd", "cost_low_usd", "how", "why")


def status(job: BatchJob, resource: VLLMResource, file: str = "definitions.py", inst: Any = None) -> Status:
    """Partitions done and missing, and the command to run next (``inst``: the Dagster instance,
    when the caller has it open)."""
    done = job.done_partitions(resource)  # with a bucket home it refreshes the cache first
    manifest = job.home.read_manifest()
    keys = (manifest or {"keys": []})["keys"]
    missing = [k for k in keys if k not in done]
    if manifest is None:
        step = (f"nothing is sharded yet: `sparkbatch preview -f {file}` shows the prompts and counts, "
                f"`sparkbatch estimate -f {file}` the bill, `sparkbatch run -f {file}` labels everything")
    elif missing:
        step = f"`sparkbatch run -f {file}` labels the {len(missing)} missing partition(s)"
    else:
        step = f"all done: `sparkbatch sql -f {file} \"FROM label_distribution\"` queries the results"
    inst = inst or instance()
    if manifest is not None and job.home.remote is not None:
        _adopt(job, inst, keys)
    limit = pool_limit(inst, job.pool) if job.pool else None
    warnings = [] if limit is not None or not job.pool else [
        f"the Dagster instance in $DAGSTER_HOME sets no limit on the {job.pool!r} pool: two runs at once (two "
        "backfills, or one backfill's runs) would each start an engine on the same GPUs; run "
        f"`dagster instance concurrency set {job.pool} 1`"]
    return Status(sharded=manifest is not None, partitions_total=len(keys), partitions_done=len(done),
                  missing=missing, next=step, pool_limit=limit, warnings=warnings)


def _adopt(job: BatchJob, inst: Any, keys: list[str]) -> None:
    """A bucket home on a Dagster instance that never ran it: its partitions registered and its
    committed ones recorded, so the UI shows what the bucket holds."""
    from ..definitions import events

    name = job.partitions_def.name or ""
    known = set(inst.get_dynamic_partitions(name))
    if [k for k in keys if k not in known]:
        inst.add_dynamic_partitions(name, [k for k in keys if k not in known])
    events.adopt(inst, job.keys["labeled_outputs"], job.home, keys)


def shard(job: BatchJob, defs: Any) -> tuple[Any, list[Any]]:
    """Materialize ``input_shards`` and what it depends on (reused when the input is unchanged);
    return the instance and the assets to materialize the rest with."""
    from dagster import AssetSelection, materialize

    job.home.refresh(write=True)  # a bucket home: wrong keys or a missing bucket stop here, in one line
    inst = instance()
    assets = list(defs.assets or job.assets)
    materialize(assets, selection=AssetSelection.assets(job.keys["input_shards"]).upstream(),
                resources=defs.resources, instance=inst, run_config=console.run_config())
    return inst, assets


def run(job: BatchJob, defs: Any, only: tuple[str, str] | None = None,
        label: dict[str, Any] | None = None) -> RunSummary:
    """Shard (if needed), label the missing partitions in one run, refresh metrics and analytics.

    ``only=(first, last)`` restricts the run to that range of partition keys (one GPU each).
    ``label``: ``labeled_outputs``' launchpad config (``LabelConfig``: ``estimate``, ``max_cost_usd``,
    ``deadline``); a stop by the brake raises :class:`BudgetStop` out of the run.
    The summary's ``timings_s`` says where the time went: ``startup`` (Python, imports, loading
    the definitions: process start to this call), ``shard``, ``label`` (engine start included),
    then ``label``'s parts (:func:`label_parts`), ``metrics``, ``analytics`` (and ``review_queue``:
    :func:`finish`), and
    ``engine_stop_wait``: the end of the engine's stop, which runs behind metrics and analytics
    (``engine_stop_background``: the whole stop, overlapped). When the engine starts ahead of
    sharding: ``engine_import`` (its ``import vllm``, before ``shard``) and ``engine_start_ahead``
    (the whole start, begun before sharding; ``label``'s ``engine_start`` is what the run waited).
    """
    from dagster import materialize

    clock = _Clock()
    early = start_engine_early(job, defs, only)
    if early is not None:
        clock.lap("engine_import")  # `import vllm`, here before the start's thread (definitions/resource.py)
    inst, assets = shard(job, defs)
    job.home.heal_current()  # a damaged pointer, even when nothing is left to label
    clock.lap("shard")
    resources = defs.resources
    resource: VLLMResource = resources[job.resource_key]
    missing = status(job, resource, inst=inst).missing
    if only:
        missing = [k for k in missing if only[0] <= k <= only[1]]
    run_ids: list[str] = []
    if missing:
        # One run over the range from the first to the last gap: one engine start. Partitions
        # in between that are already done are skipped inside the asset, not recomputed.
        print(f"sparkbatch: labeling {len(missing)} partition(s) of {job.spec.name}", file=sys.stderr)
        bar = Bar()
        with listening(bar), collecting() as found:
            config = {"ops": {"__".join(job.keys["labeled_outputs"].path): {"config": label or {}}}}
            began = time.perf_counter()
            try:
                labeled = materialize(assets, selection=[job.keys["labeled_outputs"]], resources=resources,
                                      instance=inst, run_config=console.run_config(config),
                                      tags={RANGE_START: missing[0], RANGE_END: missing[-1]})
                run_ids.append(labeled.run_id)
            finally:
                bar.close()
        clock.lap("label")
        clock.laps.update(label_parts(found, began, time.perf_counter(), clock.laps["label"]))
        if early is not None and not early.in_flight:  # the whole start, begun before sharding
            clock.laps["engine_start_ahead"] = round(early.seconds, 2)
    after = status(job, resource, inst=inst)
    result = finish(job, assets, resources, inst, missing, queue=not after.missing, clock=clock)
    # The labeling run's engine stopped behind metrics and analytics; what is left is waited for.
    close_untaken()  # an engine begun ahead that no run took (every answer came from the store)
    stopped_s = wait_for_stops()
    clock.lap("engine_stop_wait")
    if stopped_s:
        clock.laps["engine_stop_background"] = round(stopped_s, 2)
    done = summary(job, resource, after, sorted(set(missing) - set(after.missing)), result, run_ids)
    return dataclasses.replace(done, timings_s=clock.laps)


def finish(job: BatchJob, assets: list[Any], resources: Any, inst: Any, labeled: list[str], queue: bool,
           clock: _Clock) -> Any:
    """What follows the labeling, in one Dagster run: ``run_metrics`` for the ``labeled`` partitions
    (none: the run labeled nothing), ``analytics``, and ``review_queue`` when ``queue`` (every
    partition labeled: a cut of part of the rows would queue rows for good, a queued row staying
    until reviewed, that the whole job would not). One run, not one each: each costs Dagster's
    own half second, and the later ones depend on the earlier, so a failure skips what follows as
    separate runs did. ``clock``'s laps split at each step's start (``metrics``, ``analytics``,
    ``review_queue``). Its own run, as a backfill in the UI runs it: labeled_outputs' run has no
    end-of-run output."""
    from dagster import DagsterEventType, materialize

    from ..definitions.review_assets import learns

    steps = [("metrics", job.keys["run_metrics"])] if labeled else []
    steps.append(("analytics", job.keys["analytics"]))
    if queue and learns(job.spec) and "review_queue" in job.keys:
        steps.append(("review_queue", job.keys["review_queue"]))
    tags = {RANGE_START: labeled[0], RANGE_END: labeled[-1]} if labeled else None
    result = materialize(assets, selection=[key for _, key in steps], resources=resources, instance=inst,
                         run_config=console.run_config(), tags=tags)
    began = {e.step_key: e.timestamp for e in inst.all_logs(result.run_id, of_type=DagsterEventType.STEP_START)}
    for (name, _), (_, following) in zip(steps, steps[1:], strict=False):
        clock.lap(name, at=began.get("__".join(following.path)))
    clock.lap(steps[-1][0])
    return result


def run_batch(job: BatchJob, defs: Any, out: Any, errors: Any = None) -> dict[str, Any]:
    """A batch-file job (``definitions.batch_files.batch_file_job``) run as :func:`run` runs a job,
    then its result files written (``sparkbatch run-batch``; :func:`.batch.run_batch`). Example::

        job, defs = batch_file_job("requests.jsonl", resource=VLLMResource())
        run_batch(job, defs, Path("results.jsonl"), Path("errors.jsonl"))["export"]["complete"]
    """
    return batch.run_batch(job, defs, out, errors, run_json)


def run_json(job: BatchJob, defs: Any, only: tuple[str, str] | None = None,
             label: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`run`'s summary as the JSON line prints it (what the batch-file commands extend)."""
    return run(job, defs, only, label).to_json()


def label_parts(found: Collected, began: float, ended: float, label_s: float) -> dict[str, float]:
    """The ``label`` lap in parts that add up to no more than it: ``run_start`` (Dagster creates the
    run, sets up its resources, starts the step), the step's own parts as it named them
    (``engines/platform/spans.py``: ``prepare``, ``identity``, ``bookkeeping``, ``read_shards``, ``render``,
    ``prompt_keys``, ``store_lookup``, ``resume``, ``engine_start``, ``gpu_wait``, ``generation``,
    ``answers``, ``parts``, ``commit``, ``store_add``, ``events``, ``progress``, ...), ``engine_stop``
    (at the run's teardown, when it stops the engine there rather than in the background) and
    ``run_end`` (Dagster's end of the step and run, teardown aside)."""
    if not found.spans:
        return {}
    first, last = found.spans[0], found.spans[-1]
    parts: dict[str, float] = {"run_start": first.began - began}
    for spans in found.spans:
        for name, seconds in spans.seconds.items():
            parts[name] = parts.get(name, 0.0) + seconds
    stop = found.notes.get("engine_stop", 0.0)
    if stop:
        parts["engine_stop"] = stop
    parts["run_end"] = ended - last.last - stop
    # Hundredths, rounded down: the parts never add up to more than the lap.
    out = {name: int(max(seconds, 0.0) * 100) / 100 for name, seconds in parts.items()}
    over = round(sum(out.values()) - label_s, 2)
    if over > 0:
        out["run_end"] = max(round(out["run_end"] - over, 2), 0.0)
    return out


class _Clock:
    """Seconds per phase of a command; the first lap starts when the process did."""

    def __init__(self) -> None:
        import psutil

        self.laps: dict[str, float] = {}
        self._last = time.time()
        self.laps["startup"] = round(self._last - psutil.Process().create_time(), 2)

    def lap(self, name: str, at: float | None = None) -> None:
        """End lap ``name`` now, or at ``at`` (a ``time.time()`` in the past: a step's start)."""
        now = time.time() if at is None else max(min(at, time.time()), self._last)
        self.laps[name] = round(now - self._last, 2)
        self._last = now


def estimate(job: BatchJob, defs: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """Materialize the job's ``estimate`` asset (shards first if needed); return its report.

    Costs (``cost_usd``, ``best_cost_usd``, ``chosen_cost_usd``) are the whole job's: engine
    start + generation, for the prompts not already answered by the result store."""
    from dagster import materialize

    inst, assets = shard(job, defs)
    op = "__".join(job.keys["estimate"].path)
    materialize(assets, selection=[job.keys["estimate"]], resources=defs.resources, instance=inst,
                run_config={"ops": {op: {"config": overrides}}})
    report: dict[str, Any] = json.loads((job.home.estimate_dir / "estimate.json").read_text())
    for line in report["advice"]:
        print(f"sparkbatch: {line}", file=sys.stderr)
    keep = ("sample_rows", "total_rows", "model", "measured_on", "measured_tokens_per_s", "engine_start_s",
            "predicted_wall_s", "predicted_tokens_per_hour", "best_speed_basis",
            "accuracy", "accuracy_low", "accuracy_high", "stored_rows", "prompts_to_generate", "best_option",
            "best_cost_usd", "accuracy_bar", "chosen_model", "chosen_configured_as", "chosen_cost_usd", "chart", "json",
            "predicted_input_tokens", "predicted_output_tokens", "hosted")
    model_keys = ("model", "configured_as", "weights_gb", "sample_rows", "extra_rows", "accuracy", "accuracy_low",
                  "accuracy_high", "stored_rows", "prompts_to_generate", "predicted_tokens_per_hour",
                  "predicted_wall_s", "engine_start_s", "best_option", "best_cost_usd", "best_speed_basis",
                  "engine_kwargs", "reliability", "calibration", "review_budget", "review_plan")
    return {**{k: report.get(k) for k in keep},
            "options": [{k: o.get(k) for k in OPTION_KEYS} for o in report["options"]],
            "models": [{k: m.get(k) for k in model_keys}
                       | {"cost_usd": {o["name"]: o["cost_usd"] for o in m["options"]},
                          "hosted_cost_usd": {h["name"]: h["cost_usd"] for h in m.get("hosted", [])}}
                       for m in report["models"]],
            "unrunnable_models": report.get("unrunnable_models", []), "advice": report["advice"]}


def summary(job: BatchJob, resource: VLLMResource, st: Status, ran: list[str], result: Any,
            run_ids: list[str] | None = None) -> RunSummary:
    """The run's last stdout line: totals of the whole version, plus what this run did
    (``partitions_run``; ``generated``: prompts sent to the engine; ``reused``: rows answered
    from the result store).

    ``cost_usd`` is the whole bill: generation plus every engine start the version's runs paid
    (``generation_cost_usd``, ``engine_start_s`` and ``engine_start_cost_usd`` split it), the
    number the estimate predicts. ``wall_s`` and ``tokens_per_hour`` are generation alone, like
    ``predicted_wall_s``; ``prediction_error_pct`` compares the two over the prompts generated.
    ``attempts`` counts the version's run attempts, ``attempts_cost_usd`` is what they cost (the
    box's time, failed and killed attempts included) and ``wasted_usd`` the part of it that
    bought no committed shard. ``engine_starts``: the engines this command's runs (``run_ids``)
    started cold, as their attempt records say (a warm ``keep_warm`` engine reused is 0)."""
    from ..run import attempts, metrics

    version = job.output_version(resource)
    committed = metrics.committed_stats(job.home, version)
    stats = list(committed.values())
    this_run = [committed[k] for k in ran if k in committed]
    check = metrics.prediction_check(job.home, version, stats) or CostCheck()
    records = metrics.sync_attempts(job.home, version)
    bill = attempts.bill(records)
    starts = sum(r.engine_starts for r in records if r.run_id in set(run_ids or []))
    tokens = sum(s.input_tokens + s.output_tokens for s in stats)
    wall = sum(s.wall_s for s in stats)
    facts = metrics.analytics(job.spec, job.home, version)
    sure = facts.confidence
    return RunSummary(
        job=job.spec.name, partitions_total=st.partitions_total, partitions_done=st.partitions_done,
        partitions_run=len(ran), rows=facts.rows, labeled=facts.labeled, errors=facts.errors,
        input_tokens=sum(s.input_tokens for s in stats), output_tokens=sum(s.output_tokens for s in stats),
        wall_s=round(wall, 2), tokens_per_hour=round(tokens / wall * 3600) if wall else 0,
        cost_usd=check.cost_usd, generation_cost_usd=check.generation_cost_usd, engine_start_s=check.engine_start_s,
        engine_start_cost_usd=check.engine_start_cost_usd, accuracy=facts.accuracy,
        accuracy_rows=facts.accuracy_rows, accuracy_after_review=facts.accuracy_after_review,
        generated=sum(s.generated_requests or 0 for s in this_run), reused=sum(s.reused_rows for s in this_run),
        prediction=check.prediction, attempts=bill.attempts, attempts_cost_usd=bill.attempts_cost_usd,
        wasted_usd=bill.wasted_usd, engine_starts=starts,
        version=version, home=str(job.home.root), success=bool(result.success),
        review_rows=sure.review_rows if sure else None,
        review_threshold=sure.review_below if sure and sure.review_share is None else None,
        review_share=sure.review_share if sure else None, review_note=(sure.review_note or None) if sure else None,
        calibration=calibration_summary(job),
    )


def calibration_summary(job: BatchJob) -> dict[str, dict[str, Any]] | None:
    """Each model's stored calibration of the job's labels, as the run's JSON line reports it."""
    from ..run.calibration_map import stored
    from ..run.review_marks import job_labels

    found = stored(job.home.calibration_dir, job_labels(job.spec))
    keep = ("method", "rows", "ece_before", "ece_after", "brier_before", "brier_after")
    return {m: {k: getattr(c, k) for k in keep} for m, c in sorted(found.items())} or None


def sql(job: BatchJob, resource: VLLMResource, query: str) -> dict[str, Any]:
    """Run one SELECT ``query`` over the job's views (``labeled``, ``label_distribution``,
    ``review``, ``reliability``) and tables (``run_metrics``, ``attempts``) of the resource's
    version; prints a table on stderr, returns the rows. A read: an in-memory database over the
    committed files, locked (:mod:`..run.query`); a query that would write, attach, install, set
    or read another file is refused in one line, and ``metrics.duckdb`` is not opened."""
    from ..run import query as read

    job.home.refresh()  # a bucket home: the cache brought in step with what the bucket holds
    with read.read_only(job.spec, job.home, job.output_version(resource)) as con:
        columns, rows = read.query(con, query)
    print("\t".join(columns), file=sys.stderr)
    for r in rows[:200]:
        print("\t".join("" if v is None else str(v) for v in r), file=sys.stderr)
    return {"columns": columns, "rows": rows}
