"""The benchmark tables of ``docs/``, rendered from ``benchmarks/results/*.json``: every figure
in them comes from a result file a benchmark script wrote.

    python -m benchmarks.tools.doc_tables            # print the tables
    python -m benchmarks.tools.doc_tables --write    # rewrite them in the docs pages that hold them
    python -m benchmarks.tools.doc_tables --check    # exit 1 when a page's tables differ

In a page (README.md or docs/*.md) each table sits between ``<!-- table:NAME ... -->`` and
``<!-- /table -->``; ``tests/unit/test_results_files.py`` fails when one differs from what this script
renders, or when a table is in no page or in two.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
#: The pages that may hold tables.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Result files the tables leave out, and why (the test requires a reason for each).
NOT_RENDERED = {
    "h200-1b-debian-package-and-description.json":
        "measured with a 'Package: ... Description: ...' prompt that throughput.py no longer builds "
        "(its Debian mode sends the description alone since commit 245e233): it cannot be reproduced",
}
#: The estimate benchmark's jobs, in words.
ESTIMATE_JOBS = {"demo": "the demo (Debian package name + description -> section)",
                 "debtags": "debtags roles from Debian one-line summaries"}
MARKER = re.compile(r"(<!-- table:(\w+)[^>]*-->\n)(.*?)(<!-- /table -->)", re.S)

Results = dict[str, dict[str, Any]]


def load_results(folder: Path = RESULTS) -> Results:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def of_kind(results: Results, *kinds: str) -> list[tuple[str, dict[str, Any]]]:
    return [(n, d) for n, d in results.items() if d.get("benchmark") in kinds and n not in NOT_RENDERED]


def num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def pct(x: float) -> str:
    return f"{x:+.1f}%"


def machine(d: dict[str, Any], name: str) -> str:
    """'NVIDIA H200 x1' -> 'H200'; 'x86_64 CPU, 2 cores' -> '2-core x86_64 CPU'; a file without a
    machine: what its name says (cpu-..., h200-...)."""
    m = d.get("machine")
    if not m:
        return {"cpu": "CPU", "h200": "H200"}.get(name.split("-")[0], "?")
    gpu = re.fullmatch(r"(?:NVIDIA )?(.+?) x1", m)
    if gpu:
        return gpu.group(1)
    cpu = re.fullmatch(r"(\S+?)(?: CPU)?, (\d+) cores", m)
    return f"{cpu.group(2)}-core {cpu.group(1)} CPU" if cpu else m


def model(d: dict[str, Any]) -> str:
    name = d.get("shape") or str(d.get("model", "?")).split("@")[0]
    return name + (", dummy weights" if d.get("load_format") == "dummy" else "")


def is_gpu(d: dict[str, Any], name: str) -> bool:
    """A GPU machine: not one of the CPU forms ('x86_64 CPU, 2 cores', '2-core CPU', and
    lib/machine.py's '2-core AMD EPYC')."""
    where = machine(d, name)
    return "cpu" not in where.lower() and not re.fullmatch(r"\d+-core .+", where)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


#: Benchmark jobs (throughput.py --mode) in words.
MODES = {"debian": "Debian labels", "synthetic": "synthetic", "summary": "Debian labels from one-line summaries"}


def throughput_table(results: Results) -> str:
    """One row per throughput.py result file. The labeling-step ratio is shown only when the
    script measured it (two files carry ``labeling_s`` read later from Dagster's step log:
    ``labeling_s_source``)."""
    runs = sorted(of_kind(results, "throughput"), key=lambda nd: (
        is_gpu(nd[1], nd[0]), nd[1]["shape"], nd[1]["mode"], -nd[1]["rows"], nd[1]["date"], nd[0]))
    rows = []
    for name, d in runs:
        job = f"{MODES.get(d['mode'], d['mode'])}, {num(d['rows'])} rows, {d['max_tokens']} out"
        if d.get("engine_kwargs"):
            job += ", " + ", ".join(f"{k}={v}" for k, v in sorted(d["engine_kwargs"].items()))
        if d.get("prefilled_store_answers"):
            job += f", {num(d['prefilled_store_answers'])} answers in the result store"
        if d.get("variant"):
            job += f"; {d['variant']}"
        ratio = f"**{d['ratio']:.2f}**"
        if "labeling_ratio" in d and "labeling_s_source" not in d:
            ratio += f" (labeling step {d['labeling_ratio']:.2f})"
        pipeline = num(d["pipeline_tokens_per_s"])
        if "server_over_offline" in d:
            job += ", then server mode"
            pipeline = f"offline {pipeline}; server {num(d['server_tokens_per_s'])}"
            # Each variant named: which one is the baseline differs by run.
            shown = [f"{name} {v['server_over_offline']:.2f}" for name, v in d.get("server_variants", {}).items()]
            ratio += "; server / offline " + ("; ".join(shown) or f"{d['server_over_offline']:.2f}")
            if "server_over_offline_thawed" in d:
                ratio += f" (heap not frozen: {d['server_over_offline_thawed']:.2f})"
            if "server_b_over_offline" in d:  # throughput.py --server-b: a second server in the same rounds
                b = ", ".join(f"{k}={v}" for k, v in sorted(d["server_b_settings"].get("engine_kwargs", {}).items()))
                ratio += f"; server b ({b or 'its settings'}) / offline {d['server_b_over_offline']:.2f}"
        if "pipeline_b_s" in d:  # throughput.py --pipeline-b: the pipeline with other engine attributes
            b = ", ".join(f"{k}={v}" for k, v in sorted(d["pipeline_b_settings"].items()))
            ratio += f"; pipeline b ({b}) {d['ratio_b']:.2f}"
        for arm, v in d.get("thawed", {}).items():  # throughput.py --thawed: the same arm, heap not frozen
            ratio += f"; {arm} frozen over not frozen {v['frozen_over_thawed']:.2f}"
        generate, vs_generate = "-", "-"
        if "ratio_vs_generate" in d:
            generate = num(d["raw_generate_tokens_per_s"])
            vs_generate = f"**{d['ratio_vs_generate']:.2f}**"
            if "labeling_ratio_vs_generate" in d:
                vs_generate += f" (labeling step {d['labeling_ratio_vs_generate']:.2f})"
        where = machine(d, name) + (f" (vLLM {d['vllm']})" if d.get("vllm") else "")
        rows.append([d["date"], where, model(d), job, str(d["rounds"]), num(d["raw_tokens_per_s"]), generate,
                     pipeline, ratio, vs_generate, f"`{name}`"])
    return table(["date", "machine", "model", "job", "rounds", "raw `LLM.chat` tok/s", "raw `LLM.generate` tok/s",
                  "pipeline tok/s", "ratio (vs chat)", "ratio vs generate", "file"], rows)


def estimate_table(results: Results) -> str:
    """Predicted vs measured generation time: estimate_accuracy.py (per job and round), its
    older one-round files, and estimate_gpu.py (per sample size)."""
    rows: list[tuple[str, list[str]]] = []
    for name, d in of_kind(results, "estimate_accuracy"):
        date = d["started"][:10]
        for job, s in d["jobs"].items():
            for i, r in enumerate(s["per_round"], 1):
                rows.append((date, [date, f"{machine(d, name)}, {r['model'].split('@')[0]}",
                                    f"{ESTIMATE_JOBS.get(job, job)}, {num(r['rows'])} rows, round {i} of {s['rounds']}",
                                    num(r["sample_rows"]), f"{r['predicted_wall_s']:.1f} s",
                                    f"{r['actual_wall_s']:.1f} s", pct(r["error_pct"]), f"`{name}`"]))
    for name, d in of_kind(results, "estimate_accuracy_round"):
        others = [m["model"].split("@")[0] for m in d["models"][1:]]
        job = f"the demo, {num(d['rows'])} rows" + (f", {', '.join(others)} compared" if others else "")
        rows.append((d["date"], [d["date"], f"{machine(d, name)}, {d['model'].split('@')[0]}", job,
                                 num(d["sample_rows"]), f"{d['predicted_wall_s']:.1f} s",
                                 f"{d['actual_wall_s']:.1f} s", pct(d["error_pct"]), f"`{name}`"]))
    for name, d in of_kind(results, "estimate_gpu"):
        for n, s in sorted(d["samples"].items(), key=lambda kv: int(kv[0])):
            job = f"{MODES.get(d['mode'], d['mode'])}, {num(d['rows'])} rows, one engine"
            if d.get("variant"):
                job += f"; {d['variant']}"
            rows.append((d["date"], [d["date"], f"{machine(d, name)}, {model(d)}", job, num(int(n)),
                                     f"{s['predicted_wall_s']:.1f} s", f"{d['actual_wall_s']:.1f} s",
                                     pct(s["error_pct"]), f"`{name}`"]))
    rows.sort(key=lambda r: r[0], reverse=True)  # newest first; stable within a date
    return table(["date", "machine, model", "job", "sample", "predicted", "measured", "error", "file"],
                 [r for _, r in rows])


def memory_table(results: Results) -> str:
    rows = []
    for name, d in of_kind(results, "memory"):
        rows += [
            [d["date"], "sharding a generated Parquet input", num(d["rows"]), num(d["shards"]),
             f"{d['sharding_s']:.1f} s", f"{num(d['sharding_peak_rss_mb'])} MB (target {num(d['sharding_target_mb'])})",
             f"`{name}`"],
            [d["date"], "drawing the estimate's stratified sample from those shards"
             + (f" ({num(d['estimate_sample_rows'])} rows)" if "estimate_sample_rows" in d else ""),
             num(d["rows"]), num(d["shards"]), f"{d['estimate_sample_s']:.1f} s",
             f"{num(d['estimate_sample_peak_rss_mb'])} MB", f"`{name}`"],
        ]
        writer_rows = num(d["writer_rows"]) if "writer_rows" in d else "-"
        for shards in (4, 64):
            rows.append([d["date"], "labeled-output writer, fake engine", writer_rows, str(shards), "-",
                         f"{num(d[f'writer_peak_rss_mb_{shards}_shards'])} MB", f"`{name}`"])
    return table(["date", "what", "rows", "shards", "time", "peak RSS", "file"], rows)


def overhead_table(results: Results) -> str:
    rows = []
    for name, d in of_kind(results, "overhead"):
        for side in ("before", "now"):
            if side in d:
                t = d[side]
                code = d["before_commit"] if side == "before" else d.get("commit", "-")
                rows.append([d["date"], machine(d, name), f"{num(d['rows'])} rows, {d['shards']} shards", code,
                             str(d["rounds"]), f"{t['run_start_s']:.3f} s (step {t['step_prep_s']:.3f} s)",
                             f"{t['first_shard_s']:.3f} s", f"{t['last_commit_s']:.3f} s",
                             f"{t['metrics_run_s']:.3f} s (step {t['metrics_own_s']:.3f} s)",
                             f"**{t['to_first_request_s'] + t['tail_s']:.3f} s**", f"{t['middle_s']:.3f} s",
                             f"`{name}`"])
    return table(["date", "machine", "job", "code", "rounds", "run start", "first shard", "last commit",
                  "run_metrics run", "fixed cost", "per-row work (overlaps the engine)", "file"], rows)


def bucket_home_table(results: Results) -> str:
    """A bucket home against a folder home on the same job and engine, per round (A-B / B-A)."""
    rows = []
    for name, d in of_kind(results, "bucket_home"):
        ratios = d["labeling_ratio_rounds"]
        median = sorted(ratios)[len(ratios) // 2 - 1: len(ratios) // 2 + 1] if len(ratios) % 2 == 0 else [
            sorted(ratios)[len(ratios) // 2]]
        cpu = d.get("store_cpu_s_per_round")
        rows.append([d["date"], machine(d, name), model(d), f"{num(d['rows'])} rows, {d['shards']} shards",
                     d["variant"], ", ".join(f"{r:.3f}" for r in ratios), f"**{sum(median) / len(median):.3f}**",
                     f"{d['local'][0]['labeling_s']:.1f} s", str(round(sum(d["bucket_requests_per_round"])
                                                                   / len(d["bucket_requests_per_round"]))),
                     f"{sum(cpu) / len(cpu):.2f} s" if cpu else "-", f"`{name}`"])
    return table(["date", "machine", "model", "job", "code", "labeling, bucket / folder, per round",
                  "median of rounds", "labeling (folder, round 1)", "requests a round", "store's CPU a round",
                  "file"], rows)


def roofline_table(results: Results) -> str:
    """The estimate's roofline projection (hardware figures alone) against H200 measurements."""
    rows = []
    for name, d in of_kind(results, "roofline"):
        for j in d["jobs"]:
            job = f"{j['shape']}, {j['mode']}, {num(j['rows'])} x {j['max_tokens']} tokens"
            rows.append([d["date"], job, f"{j['projected_low_s']:.1f}-{j['projected_high_s']:.1f} s",
                         f"{j['measured_raw_s']:.1f} s ({pct(j['raw_error_low_pct'])} / "
                         f"{pct(j['raw_error_high_pct'])})",
                         f"{j['measured_pipeline_s']:.1f} s ({pct(j['pipeline_error_low_pct'])} / "
                         f"{pct(j['pipeline_error_high_pct'])})", f"{j['raw_efficiency']:.0%}", f"`{j['file']}`",
                         f"`{name}`"])
    return table(["date", "job (one H200)", "projected", "measured, plain vLLM (error of fast / slow end)",
                  "measured, sparkbatch (same)", "share of peak reached", "measurement", "file"], rows)


def lease_scaling_table(results: Results) -> str:
    """One box holding many shard claims on a slow store (lease_scaling.py): its renewal traffic
    against the previous design's, and whether another box ever took a live shard."""
    rows = []
    for name, d in of_kind(results, "lease_scaling"):
        p = d["takeover_after_pause"]
        rows.append([d["date"], machine(d, name), num(d["shards"]), f"{d['injected_latency_ms']:g} ms",
                     f"{d['lease_seconds']:g} s",
                     f"{d['claim_take_s']:.0f} s ({d['claim_take_ms_per_shard']:.0f} ms a shard)",
                     f"{d['hold_s']:.0f} s ({d['hold_lease_lengths']:.1f} leases)",
                     f"**{d['renewal_requests_per_min']:.1f}**", num(d["old_design_requests_per_min"]),
                     str(d["claim_requests_during_hold"]),
                     f"**{d['shards_taken_over_while_live']}** of {num(d['b_attempts'])} tries",
                     f"{d['release_s']:.0f} s", str(d["leases_left_after_release"]),
                     f"{p['taken_by_b']} of {p['shards']} taken, renew {p['a_renew_returned']}"
                     f" ({p['takeover_ms_per_shard']:.0f} ms a shard)", f"`{name}`"])
    return table(["date", "machine", "shards held", "added a request", "lease", "claims taken in", "held",
                  "renewal requests / min", "previous design / min", "claim requests while held",
                  "live shards taken by box B", "released in", "leases left", "box A paused past its lease",
                  "file"], rows)


def table_sink_table(results: Results) -> str:
    """The table sink's sync (table_sink.py): every shard into an empty table, a replay, one shard."""
    rows = []
    for name, d in of_kind(results, "table_sink"):
        for home in ("local", "bucket"):
            a = d[home]
            label = f"{d['fake_engine_label_s']:.0f} s" if home == "local" else "-"  # timed on the folder home
            rows.append([d["date"], machine(d, name), f"{num(d['rows'])} rows ({d['input']}), {d['shards']} shards",
                         "folder" if home == "local" else "bucket (moto, loopback)", f"{a['first_s']:.2f} s",
                         f"{a['replay_s']:.3f} s", f"{a['one_shard_s']:.2f} s", label,
                         f"deltalake {d['deltalake']}", f"`{name}`"])
    return table(["date", "machine", "job", "home", "every shard, empty table", "replay (writes nothing)",
                  "one missing shard", "labeling it, fake engine", "writer", "file"], rows)


def test_tiers_table(results: Results) -> str:
    """`make test`'s tiers (tests/support/run_tiers.py --record): each one's time, and the whole run's."""
    def mmss(seconds: float) -> str:
        return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"

    # Which tests (run_tiers.py's selection): the gate (make test) or the long ones (make soak); a file from
    # before the split ran every test.
    which = {"gate": "make test (the gate)", "long": "make soak's long tests", "all": "every test"}
    rows = []
    for name, d in of_kind(results, "test_tiers"):
        t = d["tiers"]
        rows.append([d["date"], machine(d, name), which[d.get("selection", "all")], d["load"],
                     *(mmss(t[k]["seconds"]) if k in t else "-" for k in ("unit", "e2e", "real", "browser")),
                     mmss(d["wall_s"]), f"{d['passed']} passed, {d['failed']} failed, {d['skipped']} skipped",
                     f"`{name}`"])
    return table(["date", "machine", "tests run", "else running", "unit", "e2e", "real", "browser",
                  "all tiers (wall clock)", "tests", "file"], rows)


def batch_migration_table(results: Results) -> str:
    """A team's batch files through both Batch APIs of serve-batch (batch_migration.py): each batch's wall time,
    its lines, every id once, the results' tokens against the engine's own counts."""
    rows = []
    for name, d in of_kind(results, "batch_migration"):
        for api, key in (("OpenAI Batch", "openai"), ("Anthropic Message Batches", "anthropic"),
                         ("OpenAI Batch, the same file again", "openai_resubmitted")):
            b = d[key]
            ok = b.get("answered", b.get("succeeded", 0))
            bad = b.get("error_lines", b.get("errored", 0))
            same = b["file_sums"] == {k: b["engine"][k] for k in ("input_tokens", "output_tokens")}
            reused = b.get("reused_requests")
            rows.append([d["date"], machine(d, name), api, num(b["lines"]), f"{b['wall_s']:.0f} s",
                         f"{num(ok)} answered, {num(bad)} error lines", "yes" if b["every_id_once"] else "NO",
                         f"{num(b['file_sums']['input_tokens'])} / {num(b['file_sums']['output_tokens'])}",
                         "equal" if same else "DIFFER", "-" if reused is None else num(reused), f"`{name}`"])
    return table(["date", "machine", "API", "lines", "create to ended", "results", "every custom_id once",
                  "input / output tokens in the results", "engine's own counts", "answers reused", "file"], rows)


def label_studio_table(results: Results) -> str:
    """A review round trip through Label Studio (label_studio_roundtrip.py): medians per step over rounds."""
    rows = []
    for name, d in of_kind(results, "label_studio_roundtrip"):
        per = {"export_s": "export_ms_per_task", "import_s": "import_ms_per_task", "annotate_s": "annotate_ms_per_task"}
        for step, what in (("export_s", f"export: the project and {d['tasks']} tasks with pre-annotations"),
                           ("export_again_s", "export again (creates nothing)"),
                           ("annotate_s", f"annotate the {d['tasks']} tasks through the API (gold label)"),
                           ("import_s", f"import: {d['tasks']} human labels merged"),
                           ("import_again_s", "import again (writes nothing)")):
            rows.append([d["date"], machine(d, name), what, f"{d[step]:.2f} s",
                         f"{d[per[step]]:.1f} ms" if step in per else "-", f"Label Studio {d['label_studio']}",
                         f"`{name}`"])
    return table(["date", "machine", "step", "seconds (median)", "per task", "server", "file"], rows)


#: The columns of a model's confidence figures (calibration.py's and review_estimate.py's tables).
CONFIDENCE_HEADER = ["date", "machine", "model", "gold rows", "right", "calibration", "ECE raw -> held out",
                     "Brier raw -> held out", "errors caught reviewing 5%", "10%", "20%", "file"]


def _confidence_row(d: dict[str, Any], name: str, model_id: str, gold: int, right: float, method: str,
                    ece: tuple[float, float], brier: tuple[float, float], caught: list[str]) -> list[str]:
    return [d["date"], machine(d, name), model_id.split("@")[0], num(gold), f"{right:.1%}", method,
            f"{ece[0]:.3f} -> {ece[1]:.3f}", f"{brier[0]:.3f} -> {brier[1]:.3f}", *caught, f"`{name}`"]


def calibration_table(results: Results) -> str:
    """Each model's confidence calibrated on a finished job's gold rows (calibration.py): ECE and Brier
    before and after (held out), and the errors caught at each share of rows reviewed (held out, on the
    model's own confidences, 95% Wilson interval)."""
    rows = []
    for name, d in of_kind(results, "calibration"):
        for m in d["models"]:
            plans = {p["target"]: p for p in m.get("review_raw") or [] if p["asked"] == "budget"}
            caught = [f"{b:.0%}: {plans[b]['caught']['value']:.1%} ({plans[b]['caught']['low']:.1%}-"
                      f"{plans[b]['caught']['high']:.1%})" if b in plans else "-" for b in (0.05, 0.1, 0.2)]
            rows.append(_confidence_row(d, name, m["model"], m["gold_rows"], m["accuracy"], m["method"],
                                        (m["before"]["ece"], m["after_held_out"]["ece"]),
                                        (m["before"]["brier"], m["after_held_out"]["brier"]), caught))
    return table(CONFIDENCE_HEADER, rows)


def review_queue_table(results: Results) -> str:
    """The review queue on rows the calibration never saw (calibration.py --unseen): per budget, the rows
    queued of every row, and the errors caught among the hidden rows against the plan's claim."""
    rows = []
    for name, d in of_kind(results, "calibration"):
        q = d.get("queue_on_unseen")
        if not q:
            continue
        models = ", ".join(m["model"].split("@")[0] for m in d["models"])
        run = d.get("run") or {"accuracy": q["accuracy"], "accuracy_rows": q["accuracy_rows"]}
        for b in q["budgets"]:
            c = b["claimed"]
            rows.append([d["date"], machine(d, name), models, f"{run['accuracy']:.1%} of {num(run['accuracy_rows'])}",
                         num(q["gold_rows"]), f"{b['budget']:.0%}", f"{num(b['rows_queued'])} of {num(b['rows'])}",
                         f"{b['caught_on_hidden_share']:.1%} ({b['caught_on_hidden']} of {b['hidden_errors']})",
                         f"{c['value']:.1%} ({c['low']:.1%}-{c['high']:.1%})", "yes" if b["inside_claim"] else "no",
                         f"`{name}`"])
    return table(["date", "machine", "model", "accuracy (rows with gold)", "gold rows used", "budget", "rows queued",
                  "errors caught on hidden rows", "claimed (95% interval)", "inside", "file"], rows)


def review_estimate_table(results: Results) -> str:
    """The estimate's confidence figures per model (review_estimate.py): the calibration with ECE and
    Brier before and after (held out), and the errors caught at 5/10/20% of rows reviewed against the
    most any order could catch (every reviewed row wrong)."""
    rows = []
    for name, d in of_kind(results, "review_estimate"):
        for m in d["models"]:
            caught = [f"{m['errors_caught'][k]:.1%} (at most {m['errors_caught_ceiling'][k]:.1%})"
                      for k in ("5%", "10%", "20%")]
            rows.append(_confidence_row(d, name, m["model"], m["gold_rows"], m["accuracy"], m["calibration_method"],
                                        (m["ece_before"], m["ece_after_held_out"]),
                                        (m["brier_before"], m["brier_after_held_out"]), caught))
    return table(CONFIDENCE_HEADER, rows)


def review_cascades_table(results: Results) -> str:
    """Each cascade pair of review_estimate.py at the demo's bar and at a best-point pick (bar 1.0):
    its held-out accuracy (95% interval) against the in-sample one at the same threshold."""
    rows = []
    for name, d in of_kind(results, "review_estimate"):
        runs = [(f"{d['accuracy_bar']:g}", d["cascades"]), ("1 (best point)", d.get("cascades_best_point", []))]
        for bar, cascades in runs:
            for c in cascades:
                first, second = (x.split("@")[0] for x in c["stages"])
                rows.append([d["date"], machine(d, name), f"{first} then {second} below {c['threshold']:g}", bar,
                             num(c["rows"]), f"{c['held_out_accuracy']:.1%} ({c['held_out_low']:.1%}-"
                             f"{c['held_out_high']:.1%})", f"{c['in_sample_accuracy']:.1%}",
                             ", ".join(f"{t:g}" for t in c["fold_thresholds"]),
                             f"{c['held_out_escalated_share']:.0%}", "yes" if c["clears"] else "no", f"`{name}`"])
    return table(["date", "machine", "cascade", "bar", "sample rows", "held out (95% interval)", "in-sample",
                  "each fold's pick", "escalated", "clears", "file"], rows)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def fresh_start_table(results: Results) -> str:
    """One row per round of each fresh_start.py file: the whole job, fresh processes, project against
    a plain ``LLM(...)`` + ``LLM.chat`` script; ``import vllm`` and ``LLM(...)`` of each; the file's
    note below the table."""
    rows, notes = [], []
    for name, d in of_kind(results, "fresh_start"):
        if d.get("note"):
            notes.append(f"- `{name}`: {d['note']}.")
        for r in d["rounds"]:
            ours, raw = r.get("project_llm_init_s"), r["raw_init_s"]
            ours_imp = r.get("project_import_vllm_s")
            rows.append([d["date"], machine(d, name), f"{d['shape']}, {d['rows']:,} rows",
                         "cold" if r["cold"] else "warm", str(r["round"]), num(r["raw_wall_s"], 1),
                         num(r["project_wall_s"], 1), f"**{r['raw_over_project']:.2f}x**",
                         f"{num(r['raw_import_s'], 1)} + {num(raw, 1)}",
                         f"{num(ours_imp, 1)} + {num(ours, 1)}" if ours is not None and ours_imp is not None else "-",
                         _ratio(ours, raw), num(r["before_wall_s"], 1) if r.get("before_wall_s") else "-",
                         f"`{name}`"])
    return table(["date", "machine", "job", "caches", "round", "raw script s", "project s", "raw / project",
                  "raw: `import vllm` + `LLM(...)` s", "project: `import vllm` + `LLM(...)` s",
                  "project `LLM(...)` / raw's", "before (72d3217) s", "file"], rows) + "\n" + "\n".join(notes) + "\n"


#: The engine start's steps as benchmarks/engine/start_trace.py names them, in words.
START_STEPS = {"import vllm": "`import vllm` (torch with it)", "vllm.LLM(...)": "`vllm.LLM(...)`",
               "device": "device facts (the memory check)", "cache_key": "compile cache key",
               "CompileCacheRun.restore": "compile cache restore", "CompileCacheRun.save": "compile cache save",
               "CompileCacheRun.finish": "compile cache save at the end", "model_identity": "model identity (hashes)",
               "_platform_hint": "platform probe (NVML)", "visible_gpus": "visible GPUs (nvidia-smi)",
               "HeldEngine.start": "whole start (GPU lock held)", "shard": "sharding (`sparkbatch run`)",
               "VLLMResource.get_engine": "the run's `get_engine` (its wait)"}


def _steps(phases: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Each traced step: (seconds in all, seconds from the process's start to its first begin)."""
    out: dict[str, tuple[float, float]] = {}
    for step, began, seconds, _thread in phases.get("events", []):
        total, first = out.get(step, (0.0, began))
        out[step] = (total + seconds, min(first, began))
    return out


def start_phases_table(results: Results) -> str:
    """The engine start's steps, before and after (a warm round of a fresh_start.py file that ran
    the before checkout too): seconds each, and when it began from the process's start."""
    rows = []
    for name, d in of_kind(results, "fresh_start"):
        for r in d["rounds"]:
            if "before_phases" not in r:
                continue
            before, after = _steps(r["before_phases"]), _steps(r["project_phases"])
            for step, words in START_STEPS.items():
                if step not in before and step not in after:
                    continue
                cell = [f"{num(x[0], 2)} (at {num(x[1], 1)})" if x else "-"
                        for x in (before.get(step), after.get(step))]
                rows.append([f"{machine(d, name)}, {d['shape']}, {'cold' if r['cold'] else 'warm'}", words, *cell,
                             f"`{name}`"])
    return table(["run", "step", "before: s (began at s)", "after: s (began at s)", "file"], rows)


TABLES: dict[str, Callable[[Results], str]] = {
    "throughput": throughput_table, "estimate": estimate_table, "memory": memory_table,
    "overhead": overhead_table, "roofline": roofline_table, "bucket_home": bucket_home_table,
    "lease_scaling": lease_scaling_table, "table_sink": table_sink_table, "test_tiers": test_tiers_table,
    "batch_migration": batch_migration_table, "label_studio": label_studio_table,
    "calibration": calibration_table, "review_estimate": review_estimate_table, "review_queue": review_queue_table,
    "review_cascades": review_cascades_table, "fresh_start": fresh_start_table, "start_phases": start_phases_table}


def render_page(text: str, results: Results, page: str = "page") -> str:
    """``text`` with every marked table replaced by its rendering."""
    def one(m: re.Match[str]) -> str:
        if m.group(2) not in TABLES:
            raise SystemExit(f"{page}: unknown table {m.group(2)!r}; known: {sorted(TABLES)}")
        return m.group(1) + "\n" + TABLES[m.group(2)](results) + "\n" + m.group(4)

    return MARKER.sub(one, text)


def tables_in(pages: list[Path] = PAGES) -> dict[str, list[str]]:
    """Each table's name -> the pages (relative paths) whose text marks it."""
    found: dict[str, list[str]] = {name: [] for name in TABLES}
    for page in pages:
        for m in MARKER.finditer(page.read_text()):
            found.setdefault(m.group(2), []).append(str(page.relative_to(ROOT)))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--write", action="store_true", help="rewrite the tables in the pages that hold them")
    ap.add_argument("--check", action="store_true", help="exit 1 when a page's tables are not what is rendered")
    args = ap.parse_args()
    results = load_results()
    if not (args.write or args.check):
        for name, render in TABLES.items():
            print(f"<!-- table:{name} -->\n{render(results)}")
        return
    stale = []
    for page in PAGES:
        text = page.read_text()
        rendered = render_page(text, results, str(page.relative_to(ROOT)))
        if rendered != text:
            stale.append(str(page.relative_to(ROOT)))
            if args.write:
                page.write_text(rendered)
    if args.check and stale:
        sys.exit(f"{', '.join(stale)}: benchmark tables differ from benchmarks/results: "
                 "run python -m benchmarks.tools.doc_tables --write")


if __name__ == "__main__":
    main()
