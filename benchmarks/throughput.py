"""Raw vLLM vs the full pipeline, same engine, same prompts, one invocation.

    python -m benchmarks.throughput --mode synthetic --rows 2000            # CPU, embedded SmolLM2
    python -m benchmarks.throughput --mode debian --rows 8000               # ../shared/data Debian set
    python -m benchmarks.throughput --mode synthetic --model .bench/llama-1b --load-format dummy \
        --rows 40000 --max-tokens 64 --gpu                                  # an H200

(a) raw ``LLM.chat``: one call over every row's messages, as a plain vLLM user would write it;
(b) raw ``LLM.generate``: every row's chat rendered and tokenized in one batch by the model's
tokenizer, then one ``LLM.generate`` call over ``TokensPrompt``s (the fastest plain vLLM script;
render and tokenize timed with it; ``--no-generate`` leaves it out);
(c) pipeline: a Dagster materialization of every partition of ``labeled_outputs`` and
``run_metrics`` (checkpoints, finalize, metrics included) on the same engine.
The prefix cache is reset before each. Every rate counts the same delivered work (the tokens
raw ``LLM.chat`` processed for all rows), so ``ratio`` is raw chat time / pipeline time and
``ratio_vs_generate`` raw generate time / pipeline time. Rounds run in A-B / B-A order (chat,
generate, pipeline; then pipeline, generate, chat). Engine start and sharding are reported
apart. The last line is one JSON object (``--out`` also writes it to a result file).

``--server`` then runs the pipeline through ``vllm serve`` (same settings) after the offline
rounds; with ``--alongside KV_GB`` the server runs beside the offline engine instead (both
with KV_GB GB of KV cache) and its rounds alternate with the offline arms' in the same A-B / B-A
order, so ``server_over_offline`` compares rounds run side by side in time.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from typing import Any

from benchmarks.lib.arm_samples import LabelRoutes, gpu_samples, profiled, server_samples
from benchmarks.lib.engine_trace import trace
from benchmarks.lib.machine import machine
from benchmarks.lib.raw_vllm import raw_generate, raw_generate_tokens
from benchmarks.lib.results_io import emit
from benchmarks.lib.server_arms import json_object, run_server_variants, server_variants, start_alongside
from benchmarks.lib.stored_answers import build
from benchmarks.lib.switches import engine_switches, thaw, thawed_arms, twin
from benchmarks.lib.workload import ENGINE, arg_parser, set_up, shape_of, vllm_version
from sparkbatch_dagster import VLLMResource, build_batch_assets
from sparkbatch_dagster.definitions.resource import close_warm_engines
from sparkbatch_dagster.run.result_store import ResultStore


def arguments() -> argparse.Namespace:
    """This script's options: the shared ones (``arg_parser``) and the arms'."""
    p = arg_parser(__doc__, mode="synthetic", rows=2000)
    p.add_argument("--repeat", type=int, default=2, help="rounds of raw + pipeline (ABBA order)")
    p.add_argument("--no-generate", dest="generate", action="store_false",
                   help="leave out the raw LLM.generate(TokensPrompt) arm")
    p.add_argument("--prefill-store", type=int, default=0,
                   help="answers (none matching) put in each pipeline round's result store first: every shard "
                        "then pays a real lookup against a store that size (10000000: a 10M-answer job)")
    p.add_argument("--server", action="store_true",
                   help="then run the pipeline again through `vllm serve` (same settings) and report server/offline")
    p.add_argument("--server-variants", default=None, metavar="JSON",
                   help='instead of --server: several server-mode settings, A-B / B-A, e.g. \'{"ids": {}, "chat": '
                        '{"server_token_ids": false}, "api4": {"engine_kwargs": {"api_server_count": 4}}}\' '
                        "(VLLMResource fields; the first is the baseline; variants whose server is the same share it)")
    p.add_argument("--alongside", type=float, default=None, metavar="KV_GB",
                   help="with --server: the server runs beside the offline engine on the same GPU, each with KV_GB "
                        "GB of KV cache, and its rounds alternate with the offline arms' (A-B-C / C-B-A), so a "
                        "drift of the machine's speed hits both modes alike")
    p.add_argument("--server-settings", type=json_object, default=None, metavar="JSON",
                   help='with --alongside: VLLMResource fields for its server on top of the run\'s, e.g. '
                        '\'{"engine_kwargs": {"api_server_count": 1}}\' (engine_kwargs merged)')
    p.add_argument("--server-b", type=json_object, default=None, metavar="JSON",
                   help="with --alongside: a second server beside the first, with these VLLMResource fields on top "
                        "(e.g. '{\"engine_kwargs\": {\"api_server_count\": 1}}'), its rounds in the same A-B / B-A "
                        "order; all three engines then take 0.3 of the GPU's memory (give KV_GB 30 at most)")
    p.add_argument("--pipeline-b", type=json_object, default=None, metavar="JSON",
                   help="a second offline pipeline arm each round, with these switches on meanwhile (switches.py "
                        "engine_switches: engine settings, label_probe, label_bar, confidence, encode_ahead), "
                        "e.g. '{\"label_decoding\": \"grammar\"}' or '{\"label_bar\": 1.0}' (every label row in one "
                        "step); reported as pipeline_b_s and pipeline_over_pipeline_b")
    p.add_argument("--out", default=None, help="also write the result object to this file (benchmarks/results/...)")
    p.add_argument("--sample", action="store_true",
                   help="per arm and round: the GPU's clock, utilization and power (nvidia-smi), and with --server "
                        "the server's batch from its /metrics (arm_samples.py); turns vLLM's stats on in every "
                        "arm alike")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="per pipeline and server arm and round: this process's garbage collections, and with "
                        "py-spy on PATH the first --profile-seconds of this process (and the server's) as "
                        "collapsed stacks in DIR (arm_samples.py)")
    p.add_argument("--profile-seconds", type=float, default=10.0)
    p.add_argument("--thawed", default="", metavar="ARMS",
                   help="comma-separated arms (pipeline, server) that also run each round with the heap not frozen "
                        "while generating (engines/platform/heap.py off), beside the default: what freezing saves")
    p.add_argument("--trace", action="store_true",
                   help="per arm and round: engine step timings, this process's CPU time, vLLM's step metrics "
                        "(engine_trace.py); turns vLLM's stats on in every arm alike")
    return p.parse_args()


def main() -> None:
    args = arguments()

    import pyarrow.parquet as pq
    from dagster import DagsterInstance, materialize

    routes = LabelRoutes()
    logging.getLogger("sparkbatch").addHandler(routes)
    logging.getLogger("sparkbatch").setLevel(logging.INFO)
    spec, kw, engine, engine_start_s = set_up(args)
    home = spec.home_path
    res = {"vllm": VLLMResource(**kw)}
    inst = DagsterInstance.get()
    rows = pq.read_table(spec.input).to_pylist()
    raw_generate(engine, spec, rows[:64])  # warm-up: compile paths, allocator
    if args.generate:
        raw_generate_tokens(engine, spec, rows[:64])

    def raw() -> float:
        engine._llm.reset_prefix_cache()
        seconds, tokens = raw_generate(engine, spec, rows)
        totals["raw_tokens"] = tokens
        return seconds

    def raw_tokens_arm() -> float:
        engine._llm.reset_prefix_cache()
        seconds, tokens = raw_generate_tokens(engine, spec, rows)
        totals["generate_tokens"] = tokens
        return seconds

    def pipeline(n: int, tag: str = "") -> float:
        # A fresh job home per round, so nothing is already done; sharding is timed apart.
        round_spec = spec.model_copy(update={"home": str(home / f"round{tag}-{n}")})
        job = build_batch_assets(spec=round_spec)
        if args.prefill_store:  # untimed: a store as big as a long job leaves it
            context = round_spec.answer_context(res["vllm"].model_identity())
            build(ResultStore(round_spec.result_store_path, context), args.prefill_store, 10_000, [])
        t = time.perf_counter()
        materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)
        totals["sharding_s"] = time.perf_counter() - t
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        if getattr(ENGINE["e"], "_llm", None) is not None:  # the server keeps its cache between rounds
            ENGINE["e"]._llm.reset_prefix_cache()  # type: ignore[attr-defined]
        tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
        t = time.perf_counter()
        # labeled_outputs, then run_metrics in its own run, as a backfill runs them: both timed.
        result = materialize(job.assets, selection=[job.keys["labeled_outputs"]], resources=res, instance=inst,
                             tags=tags)
        materialize(job.assets, selection=[job.keys["run_metrics"]], resources=res, instance=inst, tags=tags)
        seconds = time.perf_counter() - t
        # One materialization per partition, each with that partition's own numbers.
        mds = [m.metadata for m in result.asset_materializations_for_node("bench__labeled_outputs")]

        def total(name: str) -> Any:
            return sum(md[name].value for md in mds)

        assert total("rows") == len(rows), "pipeline lost rows"
        # The runner's own wall time: the rest of `seconds` is Dagster's run start and finish.
        labeling_s.append(total("wall_s"))
        totals.update(shards=len(keys), errors=total("errors"),
                      engine_tokens=total("input_tokens") + total("output_tokens"))
        return seconds

    # Rounds in A-B, B-A order (chat, generate, pipeline; then the reverse), so a drift of the
    # machine's speed hits every arm alike.
    totals: dict[str, Any] = {}
    traces: dict[str, list[dict[str, Any]]] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    times: dict[str, list[float]] = {"raw": [], "generate": [], "pipeline": [], "labeling": []}
    labeling_s = times["labeling"]
    arms: list[tuple[str, Any]] = [("raw", raw)] + ([("generate", raw_tokens_arm)] if args.generate else [])
    if args.pipeline_b:
        times["pipeline_b"] = []
    thawed = thawed_arms(args.thawed)
    if "server" in thawed and not args.alongside:
        raise SystemExit("--thawed server needs a server arm: give --server --alongside KV_GB")
    server = start_alongside(args, kw, res, pipeline, times, totals, settings=args.server_settings)
    server_b = start_alongside(args, kw, res, pipeline, times, totals, "server_b", args.server_b) \
        if args.server_b else None
    servers = {"server": server, "server_thawed": server, "server_b": server_b}
    times.update({f"{arm}_thawed": [] for arm in thawed})
    for n in range(args.repeat):
        order = [*arms, ("pipeline", functools.partial(pipeline, n))]
        if args.pipeline_b:  # the engine's attributes set while it runs
            order.append(("pipeline_b", twin(functools.partial(pipeline, n, "-b"), "labeling", times,
                                             "pipeline_b_labeling", engine_switches(engine, args.pipeline_b))))
        if "pipeline" in thawed:
            order.append(("pipeline_thawed", thaw(functools.partial(pipeline, n, "-thawed"), "labeling", times)))
        if server is not None:
            order.append(("server", functools.partial(server, n)))
            if "server" in thawed:
                order.append(("server_thawed", thaw(functools.partial(server, n, "server-thawed"), "server_labeling",
                                                    times)))
        if server_b is not None:
            order.append(("server_b", functools.partial(server_b, n)))
        for arm, run in order if n % 2 == 0 else order[::-1]:
            served = server_samples(servers[arm].url) if args.sample and arm in servers else nullcontext({})
            gpu = gpu_samples() if args.sample else nullcontext({})
            routes.arm = f"{arm} round {n}"
            with trace(engine._llm, args.trace) as where, gpu as on_gpu, served as on_server, \
                    profiled(args, arm, n, servers.get(arm)) as collected:
                times[arm].append(run())
            if collected:
                print(f"gc {arm} round {n}: {json.dumps(collected)}", file=sys.stderr, flush=True)
                samples.setdefault(f"gc:{arm}", []).append(collected)
            if args.trace:
                traces.setdefault(arm, []).append(where)
                print(f"trace {arm} round {n}: {json.dumps(where)}", file=sys.stderr, flush=True)
            if args.sample:
                samples.setdefault(arm, []).append({"gpu": on_gpu, **({"server": on_server} if on_server else {})})
                print(f"sample {arm} round {n}: {json.dumps(samples[arm][-1])}", file=sys.stderr, flush=True)
        # Each round as it ends, so a run cut short by a time limit still reports its rounds.
        print(round_line(args, times, n, thawed), file=sys.stderr, flush=True)
    if args.generate and totals["generate_tokens"] != totals["raw_tokens"]:
        print(f"warning: LLM.generate processed {totals['generate_tokens']} tokens, LLM.chat {totals['raw_tokens']}: "
              "the arms' prompts differ (chat template?)", file=sys.stderr, flush=True)
    variants = server_variants(args) if server is None else {}
    if variants:
        # The offline engine goes first: on a GPU both cannot hold 90% of the memory at once.
        res["vllm"].shutdown()

        def server_round(resource: VLLMResource, n: int, name: str) -> float:
            res["vllm"] = resource
            return pipeline(n, f"-{name}")

        run_server_variants(variants, kw, args.repeat, server_round, times, totals, ENGINE)
    res["vllm"].shutdown()
    close_warm_engines()  # --alongside: the server started beside the offline engine
    result = summarize(args, model_id=engine.model_id, max_tokens=spec.sampling.max_tokens, rows=len(rows),
                       totals=totals, times=times, engine_start_s=engine_start_s)
    emit({**result, **({"trace": traces} if traces else {}), **({"samples": samples} if samples else {}),
          **({"label_routes": routes.said} if routes.said else {})}, args.out)


def round_line(args: argparse.Namespace, times: dict[str, list[float]], n: int, thawed: list[str]) -> str:
    """Round ``n``'s seconds and ratios, one line for stderr as the round ends."""
    raw_t, pipe_t = times["raw"][-1], times["pipeline"][-1]
    line = f"round {n}: raw chat {raw_t:.2f} s, pipeline {pipe_t:.2f} s, ratio {raw_t / pipe_t:.3f}"
    if args.generate:
        gen_t = times["generate"][-1]
        line += f"; raw generate {gen_t:.2f} s, ratio vs generate {gen_t / pipe_t:.3f}"
    if args.pipeline_b:
        line += f"; pipeline b {times['pipeline_b'][-1]:.2f} s"
    for arm, name in (("server", "server/offline"), ("server_b", "b/offline")):  # --alongside's servers
        if times.get(arm):
            line += f"; {arm.replace('_', ' ')} {times[arm][-1]:.2f} s, {name} {pipe_t / times[arm][-1]:.3f}"
    for arm in thawed:
        line += f"; {arm} thawed {times[arm + '_thawed'][-1]:.2f} s"
    return line


def summarize(args: argparse.Namespace, *, model_id: str, max_tokens: int, rows: int, totals: dict[str, Any],
              times: dict[str, list[float]], engine_start_s: float) -> dict[str, Any]:
    """The result object: ``times`` holds per-round seconds of ``raw`` (LLM.chat), ``generate``
    (LLM.generate; empty with --no-generate), ``pipeline``, ``labeling`` (the runner's own time
    inside each pipeline round) and ``server`` (with --server). Every rate counts the tokens of
    raw LLM.chat, so ratios are time ratios."""
    n = args.repeat
    raw_s, pipe_s, label_s = sum(times["raw"]), sum(times["pipeline"]), sum(times["labeling"][:n])
    raw_tokens = totals["raw_tokens"] * n

    def secs(xs: list[float]) -> list[float]:
        return [round(x, 2) for x in xs]

    out: dict[str, Any] = {
        "benchmark": "throughput", "date": datetime.now(timezone.utc).date().isoformat(),
        "mode": args.mode, "model": model_id, "shape": shape_of(model_id),
        "load_format": args.load_format or "auto", "vllm": vllm_version(),
        "rows": rows, "shards": totals["shards"], "max_tokens": max_tokens, "machine": machine(), "rounds": n,
        "engine_start_s": round(engine_start_s, 1), "sharding_s": round(totals["sharding_s"], 2),
        "raw_s": secs(times["raw"]), "pipeline_s": secs(times["pipeline"]),
        "raw_tokens": totals["raw_tokens"], "pipeline_engine_tokens": totals["engine_tokens"],
        "errors": totals["errors"],
        "raw_tokens_per_s": round(raw_tokens / raw_s, 1), "pipeline_tokens_per_s": round(raw_tokens / pipe_s, 1),
        "ratio": round(raw_s / pipe_s, 4),
        "labeling_s": secs(times["labeling"][:n]), "labeling_ratio": round(raw_s / label_s, 4),
        "prefilled_store_answers": args.prefill_store,
        **({"engine_kwargs": json.loads(args.engine_kwargs)} if getattr(args, "engine_kwargs", None) else {}),
        **({"resource": args.resource} if getattr(args, "resource", None) else {}),
    }
    if times.get("generate"):
        gen_s = sum(times["generate"])
        out.update({
            "raw_generate_s": secs(times["generate"]), "raw_generate_tokens": totals["generate_tokens"],
            "raw_generate_tokens_per_s": round(raw_tokens / gen_s, 1),
            "ratio_vs_generate": round(gen_s / pipe_s, 4), "labeling_ratio_vs_generate": round(gen_s / label_s, 4),
        })
    if times.get("server"):
        server_s = sum(times["server"])
        if getattr(args, "alongside", None):
            out.update(server_alongside_kv_cache_gb=args.alongside, server_labeling_s=secs(times["server_labeling"]))
            if getattr(args, "server_settings", None):
                out["server_settings"] = args.server_settings
        out.update({
            "server_start_s": round(totals["server_start_s"], 1), "server_pipeline_s": secs(times["server"]),
            "server_tokens_per_s": round(raw_tokens / server_s, 1), "server_over_offline": round(pipe_s / server_s, 4),
        })
    if times.get("pipeline_b"):  # --pipeline-b: the same pipeline with other engine attributes, same rounds
        b_s = sum(times["pipeline_b"])
        out.update(pipeline_b_settings=args.pipeline_b, pipeline_b_s=secs(times["pipeline_b"]),
                   pipeline_b_labeling_s=secs(times["pipeline_b_labeling"]), ratio_b=round(raw_s / b_s, 4),
                   pipeline_over_pipeline_b=round(b_s / pipe_s, 4))
    if times.get("server_b"):  # --server-b: a second server's rounds, in the same order as the first's
        b_s = sum(times["server_b"])
        out.update(server_b_settings=args.server_b, server_b_start_s=round(totals["server_b_start_s"], 1),
                   server_b_pipeline_s=secs(times["server_b"]), server_b_labeling_s=secs(times["server_b_labeling"]),
                   server_b_over_offline=round(pipe_s / b_s, 4),
                   server_over_server_b=round(b_s / sum(times["server"]), 4))
    thawed = {arm: {"thawed_s": secs(times[f"{arm}_thawed"]), "frozen_s": secs(times[arm]),
                    "frozen_over_thawed": round(sum(times[f"{arm}_thawed"]) / sum(times[arm]), 4)}
              for arm in thawed_arms(getattr(args, "thawed", "")) if times.get(f"{arm}_thawed")}
    if thawed:  # the default arms freeze the heap while generating (engines/platform/heap.py); these did not
        out["thawed"] = thawed
        if "server" in thawed:
            out["server_over_offline_thawed"] = round(pipe_s / sum(times["server_thawed"]), 4)
    if len(totals.get("server_variants", {})) > 1:  # the first is the baseline above
        out["server_variants"] = {name: {
            "settings": v["settings"], "server_start_s": round(v["server_start_s"], 1),
            "server_pipeline_s": secs(times[f"server:{name}"]),
            "server_over_offline": round(pipe_s / sum(times[f"server:{name}"]), 4),
        } for name, v in totals["server_variants"].items()}
    return out


if __name__ == "__main__":
    main()
