"""benchmarks/results: every file is one JSON object a benchmark script wrote, with the keys its
kind needs and derived figures that agree with the measurements they come from; the benchmark
tables of docs/ are exactly what benchmarks/tools/doc_tables.py renders from those files."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import throughput
from benchmarks.lib import server_arms, switches
from benchmarks.tools import doc_tables

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

FILES = sorted(RESULTS.glob("*.json"))

#: Keys every result file of a kind (its ``benchmark`` key) must have.
REQUIRED = {
    "throughput": {"date", "machine", "model", "shape", "mode", "rows", "rounds", "ratio", "raw_s", "pipeline_s",
                   "raw_tokens", "raw_tokens_per_s", "pipeline_tokens_per_s"},
    "end_to_end": {"machine", "rows", "rounds", "sparkbatch_over_plain", "sparkbatch_s", "plain_s"},
    "engine_start": {"machine", "rounds", "variants"},
    "compile_cache": {"date", "machine", "model", "rounds", "archive_mb", "cold", "restored", "warm"},
    "cpu_dtype": {"date", "machine", "model", "prompts", "rounds", "arms", "float32_over_native_rows_per_s"},
    "cascade": {"date", "machine", "rows", "sample_rows", "labels", "hourly_usd", "below", "estimate", "runs",
                "cascade_over_gemma_generation"},
    "confidence": {"date", "machine", "model", "kind", "rows", "rounds", "median_s", "on_over_off", "same_answers",
                   "rows_with_confidence"},
    "label_decoding": {"date", "machine", "model", "rows", "rounds", "median_s", "grammar_over_one_step",
                       "same_answers", "same_answers_share", "output_tokens"},
    "reasoning": {"date", "machine", "model", "rows", "rounds", "budget", "median_s", "two_requests_over_native",
                  "reasoning_tokens_mean", "output_tokens", "same_answers_share"},
    "estimate_accuracy": {"machine", "started", "command", "jobs"},
    "estimate_accuracy_round": {"date", "rows", "sample_rows", "model", "predicted_wall_s", "actual_wall_s",
                                "error_pct", "models"},
    "estimate_gpu": {"date", "machine", "model", "rows", "actual_wall_s", "samples"},
    "memory_reserve": {"date", "machine", "rows", "run_peak_rss_mb", "run_tree_peak_rss_mb", "dagster_dev_rss_mb"},
    "batch_migration": {"date", "machine", "model", "code", "lines", "openai", "anthropic", "openai_resubmitted",
                        "resubmitted_lines_generated_again"},
    "memory": {"date", "rows", "shards", "sharding_s", "sharding_peak_rss_mb", "estimate_sample_s",
               "estimate_sample_peak_rss_mb", "writer_peak_rss_mb_4_shards", "writer_peak_rss_mb_64_shards"},
    "reuse": {"machine", "rows", "rounds", "appended_generated", "appended_s"},
    "store_lookup": {"machine", "stored_answers", "lookup_s", "store_mb", "segments"},
    "tensor_parallel": {"date", "machine", "shape", "rows", "tensor_parallel_size", "nnodes", "estimate_options",
                        "rows_labeled", "run_wall_s"},
    "overhead": {"date", "machine", "rows", "shards", "rounds", "now", "now_rounds"},
    "precision": {"date", "machine", "shape", "rows", "rounds", "a", "b", "pipeline_ratio", "labeling_ratio",
                  "raw_ratio"},
    "demo_gpu": {"date", "machine", "make_install", "command", "summary"},
    "install_time": {"date", "machine", "target", "installer", "cold_caches", "seconds", "steps_s", "load_before",
                     "code", "command"},
    "cli_cost": {"date", "machine", "code", "rows", "rounds", "now", "now_median", "command"},
    "fork_heap": {"date", "machine", "code", "rounds", "parent_objects", "frozen_s", "unfrozen_s",
                  "unfrozen_over_frozen", "command"},
    "roofline": {"date", "machine", "hardware", "efficiency", "command", "jobs"},
    "server_client": {"date", "machine", "rows", "rounds", "token_ids"},  # chat: only when --arms names it
    "frontend_cpu": {"date", "machine", "rows", "rounds", "prompts_per_request", "grouped", "one_each",
                     "grouped_over_one_each_frontend"},
    "server_stats": {"date", "machine", "rows", "rounds", "max_tokens", "stats_off", "stats_on", "off_over_on_frontend",
                     "off_over_on_wall"},
    "data_parallel": {"date", "machine", "model", "shape", "rows", "rounds", "gpus", "speedup", "single_s",
                      "parallel_s", "tokens"},
    "bucket_home": {"date", "machine", "model", "shape", "rows", "shards", "rounds", "local", "bucket",
                    "labeling_ratio_rounds", "pipeline_ratio_rounds", "bucket_requests_per_round", "command",
                    "variant"},
    "table_sink": {"date", "machine", "deltalake", "input", "rows", "shards", "rounds", "fake_engine_label_s", "local",
                   "bucket", "command"},
    "lease_scaling": {"date", "machine", "shards", "injected_latency_ms", "lease_seconds", "claim_take_s", "hold_s",
                      "renewal_requests", "renewal_requests_per_min", "claim_requests_during_hold",
                      "old_design_requests_per_min", "shards_taken_over_while_live", "leases_left_after_release",
                      "takeover_after_pause", "claim_take_ms_per_shard", "hold_lease_lengths", "b_attempts",
                      "release_s"},
    "fault_harness": {"date", "machine", "code", "command", "start_seed", "episodes", "passed", "homes", "faults",
                      "invariant_breaks", "failing_seeds", "harness_errors"},
    "label_step": {"date", "machine", "engine", "rows", "shards", "code", "label_s", "timings_s"},
    "test_tiers": {"date", "machine", "code", "command", "load", "overlap", "workers", "tiers", "wall_s", "passed",
                   "failed", "skipped"},
    "batch_file": {"date", "machine", "model", "shape", "mode", "rows", "rounds", "column", "batch", "ratio",
                   "labeling_ratio", "sharding_ratio", "cpu_ratio", "export_s_per_1k_rows", "same_tokens"},
    "code_shape": {"date", "machine", "code", "command", "engines_modules", "engines_import_arrows", "options",
                   "dict_str_any_functions", "longest_generate", "cost_usd_indexes", "modules", "largest_module"},
    "label_studio_roundtrip": {"date", "machine", "code", "command", "label_studio", "label_studio_sdk", "job",
                               "engine", "tasks", "rounds", "export_s", "export_again_s", "annotate_s", "import_s",
                               "import_again_s", "round_trip_s", "rounds_s"},
    "review_estimate": {"date", "machine", "code", "command", "rows", "sample_rows", "estimate_s", "models",
                        "cascades"},
    "calibration": {"date", "machine", "code", "command", "source", "rows", "folds", "labels", "models"},
    "upload_memory": {"date", "machine", "code", "command", "mib", "openai", "anthropic"},
    "fresh_start": {"date", "machine", "code", "command", "shape", "rows", "model", "settings", "rounds"},
}
#: Keys of each model and each cascade pair of a review_estimate result.
REVIEW_MODEL_KEYS = {"model", "accuracy", "calibration_method", "gold_rows", "ece_before", "ece_after_held_out",
                     "brier_before", "brier_after_held_out", "errors_caught"}
REVIEW_CASCADE_KEYS = {"cascade", "folds", "held_out_accuracy", "held_out_low", "held_out_high", "in_sample_accuracy",
                       "in_sample_minus_held_out"}

#: Kinds that measure a `vllm serve` frontend's CPU in two arms: (arm a, arm b, the a over b key).
FRONTEND_ARMS = {"frontend_cpu": ("grouped", "one_each", "grouped_over_one_each_frontend"),
                 "server_stats": ("stats_off", "stats_on", "off_over_on_frontend")}


def load(path: Path) -> dict[str, Any]:
    with path.open() as f:
        data = json.load(f)  # a log line before the object, or a second object, fails here
    assert isinstance(data, dict), f"{path.name}: one JSON object, not {type(data).__name__}"
    return data


def close(a: float, b: float, rel: float = 0.005) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.002)


def throughput_problems(d: dict[str, Any]) -> list[str]:
    """What is missing or inconsistent in one throughput result object."""
    problems = [f"missing {k}" for k in sorted(REQUIRED["throughput"] - d.keys())]
    if problems:
        return problems
    n = d["rounds"]
    lists = {k: d[k] for k in ("raw_s", "pipeline_s", "labeling_s", "raw_generate_s", "server_pipeline_s") if k in d}
    problems += [f"{k} has {len(v)} rounds, not {n}" for k, v in lists.items() if len(v) != n]
    raw, pipe = sum(d["raw_s"]), sum(d["pipeline_s"])
    if not close(d["ratio"], raw / pipe):
        problems.append(f"ratio {d['ratio']} is not sum(raw_s) / sum(pipeline_s) = {raw / pipe:.4f}")
    if not close(d["raw_tokens_per_s"], d["raw_tokens"] * n / raw):
        problems.append("raw_tokens_per_s is not raw_tokens x rounds / sum(raw_s)")
    if not close(d["pipeline_tokens_per_s"], d["raw_tokens"] * n / pipe):
        problems.append("pipeline_tokens_per_s is not raw_tokens x rounds / sum(pipeline_s)")
    if "labeling_ratio" in d and not close(d["labeling_ratio"], raw / sum(d["labeling_s"])):
        problems.append("labeling_ratio is not sum(raw_s) / sum(labeling_s)")
    if "raw_generate_s" in d:  # the second raw baseline: LLM.generate over TokensPrompts
        gen = sum(d["raw_generate_s"])
        problems += [f"missing {k}" for k in ("ratio_vs_generate", "raw_generate_tokens_per_s") if k not in d]
        if "ratio_vs_generate" in d and not close(d["ratio_vs_generate"], gen / pipe):
            problems.append("ratio_vs_generate is not sum(raw_generate_s) / sum(pipeline_s)")
    if "server_vs_offline" in d:
        problems.append("server_vs_offline: the key is server_over_offline")
    if "server_pipeline_s" in d:
        if "server_over_offline" not in d:
            problems.append("missing server_over_offline")
        elif not close(d["server_over_offline"], pipe / sum(d["server_pipeline_s"])):
            problems.append("server_over_offline is not sum(pipeline_s) / sum(server_pipeline_s)")
    for arm, v in d.get("thawed", {}).items():  # --thawed: the arm again with the heap not frozen
        if len(v["thawed_s"]) != n or not close(v["frozen_over_thawed"], sum(v["thawed_s"]) / sum(v["frozen_s"])):
            problems.append(f"thawed.{arm}: {n} rounds and frozen_over_thawed = sum(thawed_s) / sum(frozen_s)")
    if "server_over_offline_thawed" in d and not close(d["server_over_offline_thawed"],
                                                       pipe / sum(d["thawed"]["server"]["thawed_s"])):
        problems.append("server_over_offline_thawed is not sum(pipeline_s) / sum(thawed.server.thawed_s)")
    if "server_b_pipeline_s" in d:  # --server-b: a second server in the same rounds
        b = sum(d["server_b_pipeline_s"])
        if len(d["server_b_pipeline_s"]) != n or not close(d["server_b_over_offline"], pipe / b):
            problems.append(f"server_b: {n} rounds, server_b_over_offline = sum(pipeline_s) / sum(server_b_pipeline_s)")
        if not close(d["server_over_server_b"], b / sum(d["server_pipeline_s"])):
            problems.append("server_over_server_b is not sum(server_b_pipeline_s) / sum(server_pipeline_s)")
    for name, v in d.get("server_variants", {}).items():  # --server-variants: the first is the baseline
        if len(v["server_pipeline_s"]) != n:
            problems.append(f"server variant {name} has {len(v['server_pipeline_s'])} rounds, not {n}")
        elif not close(v["server_over_offline"], pipe / sum(v["server_pipeline_s"])):
            problems.append(f"server variant {name}: server_over_offline is not sum(pipeline_s) / its sum")
    if d.get("gpus", 1) > 1 or "data_parallel" in d or "speedup" in d:  # a data-parallel run
        problems += [f"missing {k} (data-parallel run)" for k in ("gpus", "speedup") if k not in d]
    return problems


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_result_file_is_one_object_with_its_kinds_keys(path):
    d = load(path)
    kind = d.get("benchmark")
    assert kind in REQUIRED, f"{path.name}: 'benchmark' is {kind!r}, not one of {sorted(REQUIRED)}"
    if kind == "throughput":
        assert throughput_problems(d) == [], path.name
    else:
        assert REQUIRED[kind] <= d.keys(), f"{path.name}: missing {sorted(REQUIRED[kind] - d.keys())}"
    if kind == "bucket_home":  # every round's ratio is that round's bucket arm over its local arm
        pairs = list(zip(d["local"], d["bucket"], strict=True))
        assert len(pairs) == d["rounds"], path.name
        assert all(close(r, b["labeling_s"] / a["labeling_s"])
                   for r, (a, b) in zip(d["labeling_ratio_rounds"], pairs, strict=True)), path.name
    if kind == "fault_harness":  # every episode passed, failed (with its replay command) or broke the harness
        assert d["passed"] + len(d["failing_seeds"]) + len(d["harness_errors"]) == d["episodes"], path.name
        # Files written before the harness moved to tests/support/ name its old path.
        replays = ("python tests/support/harness.py --seed ", "python tests/harness.py --seed ")
        assert all(f["replay"].startswith(replays) for f in d["failing_seeds"]), path.name
    if kind == "batch_file":  # the ratios are sums of the rounds' figures, batch file over column
        for key, name in (("ratio", "total_s"), ("labeling_ratio", "labeling_s"), ("cpu_ratio", "cpu_s")):
            want = sum(r[name] for r in d["batch"]) / sum(r[name] for r in d["column"])
            assert close(d[key], want, rel=0.01), f"{path.name}: {key}"
        assert len(d["batch"]) == len(d["column"]) == d["rounds"], path.name
    if kind in FRONTEND_ARMS:  # per row: the median arm's frontend CPU over the rows; the ratio of the two
        a, b, ratio = FRONTEND_ARMS[kind]
        for arm in (a, b):
            assert len(d[arm]["frontend_cpu_s"]) == d["rounds"], path.name
            ms = statistics.median(d[arm]["frontend_cpu_s"]) / d["rows"] * 1000
            assert close(d[arm]["frontend_ms_per_row"], ms, rel=0.01), f"{path.name}: {arm}"
        assert close(d[ratio], d[a]["frontend_ms_per_row"] / d[b]["frontend_ms_per_row"], rel=0.01), path.name
    if kind == "server_stats":  # the wall ratio is the sums of the rounds
        assert close(d["off_over_on_wall"], sum(d["stats_off"]["wall_s"]) / sum(d["stats_on"]["wall_s"]), rel=0.01)
    if kind == "review_estimate":  # each model's calibration and budget; each pair held out against in-sample
        assert all(m.keys() >= REVIEW_MODEL_KEYS and set(m["errors_caught"]) == {"5%", "10%", "20%"}
                   for m in d["models"]), path.name
        for c in d["cascades"] + d.get("cascades_best_point", []):
            assert c.keys() >= REVIEW_CASCADE_KEYS, path.name
            assert c["held_out_low"] <= c["held_out_accuracy"] <= c["held_out_high"], path.name
            assert close(c["in_sample_minus_held_out"], c["in_sample_accuracy"] - c["held_out_accuracy"]), path.name
    if kind == "label_studio_roundtrip":  # each step's figure is the median of its rounds
        assert len(d["rounds_s"]) == d["rounds"], path.name
        for step in ("export_s", "export_again_s", "annotate_s", "import_s", "import_again_s"):
            assert close(d[step], statistics.median(r[step] for r in d["rounds_s"])), (path.name, step)
    if kind == "fresh_start":  # issue 61: each round's walls, starts and ratio, the ratio from the walls
        for r in d["rounds"]:
            need = {"project_wall_s", "raw_wall_s", "project_engine_start_s", "raw_init_s", "cold"}
            assert r.keys() >= need, path.name
            assert close(r["raw_over_project"], r["raw_wall_s"] / r["project_wall_s"], rel=0.01), path.name
    if kind == "cli_cost" and "before" in d:  # each ratio is the sums of the rounds, before over now
        for k, ratio in d["before_over_now"].items():
            assert len(d["before"][k]) == len(d["now"][k]) == d["rounds"], path.name
            assert close(ratio, sum(d["before"][k]) / sum(d["now"][k]), rel=0.01), (path.name, k)
    if kind == "fork_heap":  # the ratio is the medians'
        assert len(d["frozen_s"]) == len(d["unfrozen_s"]) == d["rounds"], path.name
        assert close(d["unfrozen_over_frozen"], statistics.median(d["unfrozen_s"]) / statistics.median(d["frozen_s"]),
                     rel=0.01), path.name
    if kind == "lease_scaling":  # the per-minute figures are the counts over the hold, and the old design's formula
        assert close(d["renewal_requests_per_min"], d["renewal_requests"] * 60 / d["hold_s"], rel=0.01), path.name
        assert close(d["old_design_requests_per_min"], d["shards"] * 2 * 3 / d["lease_seconds"] * 60), path.name


def test_there_are_result_files():
    assert len(FILES) >= 10


@pytest.fixture(autouse=True)
def _no_machine_probe(monkeypatch):
    """summarize names the machine (lib/machine.py asks nvidia-smi where it is on PATH): not here,
    where a unit test starts no process."""
    monkeypatch.setattr(throughput, "machine", lambda cpu_only=False: "NVIDIA H200 x1, 16 cores")


def fake_run(generate: bool, server: bool) -> dict[str, Any]:
    """throughput.py's own result object, from made-up round times (no engine)."""
    args = argparse.Namespace(repeat=2, mode="synthetic", load_format="dummy", prefill_store=0)
    times = {"raw": [10.0, 12.0], "pipeline": [9.0, 11.0], "labeling": [8.5, 10.5],
             "generate": [9.5, 11.5] if generate else []}
    totals = {"raw_tokens": 1000, "generate_tokens": 1000, "shards": 8, "sharding_s": 0.4, "errors": 0,
              "engine_tokens": 1000, "server_start_s": 50.0}
    if server:
        times["server"] = times["server:chat"] = [12.0, 13.0]
        times["server:token_ids"] = [10.0, 10.0]
        totals["server_variants"] = {"chat": {"settings": {}, "server_start_s": 50.0},
                                     "token_ids": {"settings": {"server_token_ids": True}, "server_start_s": 50.0}}
    return throughput.summarize(args, model_id="llama-1b@abc", max_tokens=64, rows=500, totals=totals,
                                times=times, engine_start_s=60.0)


@pytest.mark.parametrize(("generate", "server"), [(True, False), (False, False), (True, True)])
def test_throughput_script_writes_every_required_key(generate, server):
    d = fake_run(generate, server)
    assert d["benchmark"] == "throughput" and d["shape"] == "llama-1b"
    assert throughput_problems(d) == []
    assert ("ratio_vs_generate" in d) == generate
    if generate:
        assert d["ratio_vs_generate"] == round(21.0 / 20.0, 4)
    assert ("server_over_offline" in d) == server
    if server:
        assert d["server_variants"]["token_ids"]["server_over_offline"] == round(20.0 / 20.0, 4)
        assert d["server_over_offline"] == d["server_variants"]["chat"]["server_over_offline"] == round(20 / 25, 4)
    assert d["ratio"] == round(22.0 / 20.0, 4)


def test_thawed_arms_are_summed_against_their_frozen_twins():
    """--thawed server: the server arm again with engines/platform/heap.py off; its figures from its own rounds."""
    args = argparse.Namespace(repeat=2, mode="synthetic", load_format="dummy", prefill_store=0, thawed="server",
                              alongside=40)
    times = {"raw": [10.0, 12.0], "pipeline": [9.0, 11.0], "labeling": [8.5, 10.5], "server": [10.0, 10.0],
             "server_labeling": [9.0, 9.0], "server_thawed": [12.0, 13.0]}
    totals = {"raw_tokens": 1000, "shards": 8, "sharding_s": 0.4, "errors": 0, "engine_tokens": 1000,
              "server_start_s": 50.0}
    d = throughput.summarize(args, model_id="llama-1b@abc", max_tokens=64, rows=500, totals=totals, times=times,
                             engine_start_s=60.0)
    assert throughput_problems(d) == []
    assert d["thawed"] == {"server": {"thawed_s": [12.0, 13.0], "frozen_s": [10.0, 10.0], "frozen_over_thawed": 1.25}}
    assert d["server_over_offline_thawed"] == 0.8 and d["server_over_offline"] == 1.0
    with pytest.raises(SystemExit, match="not arms"):
        switches.thawed_arms("raw")


def test_a_server_variant_adds_engine_arguments_to_the_runs_own():
    """--server-variants '{"api4": {"engine_kwargs": {"api_server_count": 4}}}' on dummy weights: the
    variant's server must still get load_format=dummy (replaced, it would look for real weights)."""
    kw = {"model": "/tmp/llama-1b", "engine_kwargs": {"load_format": "dummy"}, "max_num_seqs": 1024}
    api4 = server_arms.with_variant(kw, {"engine_kwargs": {"api_server_count": 4}, "server_token_ids": True})
    assert api4["engine_kwargs"] == {"load_format": "dummy", "api_server_count": 4}
    assert api4["server_token_ids"] is True and api4["max_num_seqs"] == 1024
    assert server_arms.with_variant(kw, {}) == kw and kw["engine_kwargs"] == {"load_format": "dummy"}
    assert "engine_kwargs" not in server_arms.with_variant({"model": "m"}, {"max_in_flight": 64})


def test_the_docs_tables_are_rendered_from_the_result_files():
    where = doc_tables.tables_in()
    assert {name: len(pages) for name, pages in where.items()} == {name: 1 for name in doc_tables.TABLES}, \
        f"every table in exactly one page (README.md or docs/*.md): {where}"
    results = doc_tables.load_results(RESULTS)
    for page in doc_tables.PAGES:
        text = page.read_text()
        assert doc_tables.render_page(text, results) == text, \
            f"{page.name}'s benchmark tables are stale: python -m benchmarks.tools.doc_tables --write"


def test_every_table_file_is_rendered_or_left_out_for_a_reason():
    results = doc_tables.load_results(RESULTS)
    tabled = {"throughput", "estimate_accuracy", "estimate_accuracy_round", "estimate_gpu", "memory", "roofline"}
    text = "".join(page.read_text() for page in doc_tables.PAGES)
    for name, d in results.items():
        if d.get("benchmark") in tabled:
            assert (f"`{name}`" in text) != (name in doc_tables.NOT_RENDERED), name
    for name, why in doc_tables.NOT_RENDERED.items():
        assert name in results and why


def test_a_second_server_is_summed_from_its_own_rounds():
    """--server-b: a second server beside the first, its figures from its own rounds."""
    args = argparse.Namespace(repeat=2, mode="synthetic", load_format="dummy", prefill_store=0, alongside=30,
                              server_b={"engine_kwargs": {"api_server_count": 1}})
    times = {"raw": [10.0, 12.0], "pipeline": [9.0, 11.0], "labeling": [8.5, 10.5], "server": [10.0, 10.0],
             "server_labeling": [9.0, 9.0], "server_b": [12.0, 13.0], "server_b_labeling": [11.0, 12.0]}
    totals = {"raw_tokens": 1000, "shards": 8, "sharding_s": 0.4, "errors": 0, "engine_tokens": 1000,
              "server_start_s": 50.0, "server_b_start_s": 40.0}
    d = throughput.summarize(args, model_id="llama-1b@abc", max_tokens=64, rows=500, totals=totals, times=times,
                             engine_start_s=60.0)
    assert throughput_problems(d) == []
    assert d["server_b_over_offline"] == 0.8 and d["server_over_server_b"] == 1.25 and d["server_over_offline"] == 1.0
    assert d["server_b_settings"] == {"engine_kwargs": {"api_server_count": 1}}
    assert "api_server_count=1) / offline 0.80" in doc_tables.throughput_table({"x.json": d})


def test_every_script_names_its_machine_in_one_form_the_tables_read(monkeypatch):
    """lib/machine.py: the GPUs the run sees (CUDA_VISIBLE_DEVICES by index or UUID) and the host's
    cores, or the CPU's cores and model; doc_tables sorts the second as a CPU."""
    import os
    import shutil
    import subprocess

    from benchmarks.lib import machine as where

    smi = "0, GPU-a, NVIDIA H100 80GB HBM3\n1, GPU-b, NVIDIA H100 80GB HBM3\n"
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: argparse.Namespace(stdout=smi))
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-b")
    assert where.machine() == "NVIDIA H100 80GB HBM3 x1, 16 cores"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert where.machine() == "NVIDIA H100 80GB HBM3 x2, 16 cores"
    cpu = where.machine(cpu_only=True)
    assert cpu.startswith("16-core ") and len(cpu) > len("16-core ")
    assert not doc_tables.is_gpu({"machine": cpu}, "cpu-x.json")
    assert doc_tables.is_gpu({"machine": where.machine()}, "h100-x.json")
