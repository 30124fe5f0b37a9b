"""Raw vLLM vs the full pipeline, same engine, same prompts, one invocation.

    python benchmarks/throughput.py --mode synthetic --rows 2000            # CPU, embedded SmolLM2
    python benchmarks/throughput.py --mode debian --rows 8000               # ../shared/data Debian set
    python benchmarks/throughput.py --mode synthetic --model .bench/llama-1b --load-format dummy \
        --rows 40000 --max-tokens 64 --gpu                                  # an H200

(a) raw: one ``LLM.chat`` call over every row's messages, as a plain vLLM user would write it;
(b) pipeline: a Dagster materialization of every partition of ``labeled_outputs`` and
``run_metrics`` (checkpoints, finalize, metrics included) on the same engine, prefix cache reset
in between. Both rates count the same delivered work (the tokens raw vLLM processed for all
rows), so ``ratio`` is raw time / pipeline time. Engine start and sharding are reported apart.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets  # noqa: E402
from sparkbatch_dagster.engines.base import Engine  # noqa: E402
from sparkbatch_dagster.results import ResultStore  # noqa: E402

DEBIAN = ROOT.parent / "shared" / "data" / "debian_packages.parquet"
_ENGINE: dict[str, Engine] = {}


def synthetic_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = "alpha beta gamma delta river stone cloud metal paper glass tiger maple orbit pixel".split()
    return [{"id": f"s{i:07d}", "text": " ".join(rng.choice(words) for _ in range(rng.randint(150, 250)))}
            for i in range(n)]


def debian_rows(n: int, path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    import pyarrow.parquet as pq

    if not path.exists():
        raise SystemExit(f"{path} not found: the debian mode needs the shared data set (--data)")
    rows = pq.read_table(path, columns=["package", "section", "description"]).to_pylist()
    rows = rows[:n] if n else rows
    labels = sorted({r["section"] for r in rows})
    return rows, labels


def build_spec(args: argparse.Namespace, home: Path) -> JobSpec:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = home / "input.parquet"
    if args.mode == "synthetic":
        pq.write_table(pa.Table.from_pylist(synthetic_rows(args.rows)), src)
        return JobSpec(
            name="bench", input=str(src), id_column="id", text_columns=["text"], home=str(home),
            system_prompt="You are a careful summarizer. " * 25,
            user_template="Summarize the following notes in one paragraph:\n{{ text }}",
            sampling=SamplingSpec(max_tokens=args.max_tokens, ignore_eos=True), shard_count=args.shards,
        )
    rows, labels = debian_rows(args.rows, Path(args.data))
    pq.write_table(pa.Table.from_pylist(rows), src)
    # Description only: the set's duplicate descriptions (5.6%) are then exact duplicate prompts.
    return JobSpec(
        name="bench", input=str(src), id_column="package", text_columns=["description"],
        home=str(home), gold_column="section",
        system_prompt="You sort Debian packages into archive sections. Allowed: " + ", ".join(labels) + ".",
        user_template="Description: {{ description }}\n\nWhich section is this package in?",
        output=OutputSpec(kind="label", labels=labels), sampling=SamplingSpec(max_tokens=8),
        shard_count=args.shards,
    )


def machine() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    except Exception:  # noqa: S110 - CPU machine
        pass
    return f"{platform.machine()} CPU, {os.cpu_count()} cores"


def raw_generate(engine: Any, spec: JobSpec, rows: list[dict[str, Any]]) -> tuple[float, int]:
    """What a plain vLLM user writes: render every row, one LLM.chat call."""
    from sparkbatch_dagster.engines.vllm_offline import sampling_params
    from sparkbatch_dagster.prompts import render

    convs = [render(spec.system_prompt, spec.user_template, {c: r[c] for c in spec.text_columns}).messages()
             for r in rows]
    params = sampling_params(spec.sampling, spec.output)
    started = time.perf_counter()
    outs = engine._llm.chat(convs, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    return seconds, sum(len(o.prompt_token_ids) + len(o.outputs[0].token_ids) for o in outs)


def arg_parser(doc: str | None, mode: str, rows: int) -> argparse.ArgumentParser:
    """The job and engine options every benchmark here shares."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    p.add_argument("--mode", choices=["synthetic", "debian"], default=mode)
    p.add_argument("--rows", type=int, default=rows)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default=None, help="HF folder; default: the embedded SmolLM2")
    p.add_argument("--load-format", default=None, help="'dummy': random weights of the model's shape")
    p.add_argument("--gpu", action="store_true", help="GPU settings (0.9 memory, 1024 seqs)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--home", default=None)
    p.add_argument("--data", default=str(DEBIAN), help="the Debian parquet (debian mode)")
    return p


def set_up(args: argparse.Namespace) -> tuple[JobSpec, dict[str, Any], Engine, float]:
    """A fresh job home and Dagster instance, the job's spec, the engine settings, and the
    engine started once (timed) and kept warm: every ``VLLMResource(**kw)`` of the rounds gets
    it through the resource's own lifecycle, its start kept out of the rounds."""
    home = Path(args.home or tempfile.mkdtemp(prefix="sparkbatch-bench-"))
    os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home"))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    spec = build_spec(args, home)
    kw: dict[str, Any] = {"model": args.model, "max_model_len": 2048, "keep_warm": True}
    kw["max_num_seqs"] = args.max_num_seqs or (1024 if args.gpu else 256)
    kw["gpu_memory_utilization"] = 0.9 if args.gpu else 0.3
    if args.load_format:
        kw["engine_kwargs"] = {"load_format": args.load_format}
    started = time.perf_counter()
    engine = _ENGINE["e"] = VLLMResource(**kw).get_engine()
    return spec, kw, engine, time.perf_counter() - started


def main() -> None:
    p = arg_parser(__doc__, mode="synthetic", rows=2000)
    p.add_argument("--repeat", type=int, default=2, help="rounds of raw + pipeline (ABBA order)")
    p.add_argument("--prefill-store", type=int, default=0,
                   help="answers (none matching) put in each pipeline round's result store first: every shard "
                        "then pays a real lookup against a store that size (10000000: a 10M-answer job)")
    p.add_argument("--server", action="store_true",
                   help="then run the pipeline again through `vllm serve` (same settings) and report server/offline")
    args = p.parse_args()

    import pyarrow.parquet as pq
    from dagster import DagsterInstance, materialize

    spec, kw, engine, engine_start_s = set_up(args)
    home = spec.home_path
    res = {"vllm": VLLMResource(**kw)}
    inst = DagsterInstance.get()
    rows = pq.read_table(spec.input).to_pylist()
    raw_generate(engine, spec, rows[:64])  # warm-up: compile paths, allocator

    def raw() -> float:
        engine._llm.reset_prefix_cache()
        seconds, tokens = raw_generate(engine, spec, rows)
        totals["raw_tokens"] = tokens
        return seconds

    def pipeline(n: int, tag: str = "") -> float:
        # A fresh job home per round, so nothing is already done; sharding is timed apart.
        round_spec = spec.model_copy(update={"home": str(home / f"round{tag}-{n}")})
        job = build_batch_assets(spec=round_spec)
        if args.prefill_store:  # untimed: a store as big as a long job leaves it
            from store_lookup import build

            context = round_spec.answer_context(res["vllm"].model_identity())
            build(ResultStore(round_spec.result_store_path, context), args.prefill_store, 10_000, [])
        t = time.perf_counter()
        materialize(job.assets, selection=[job.keys["input_shards"]], resources=res, instance=inst)
        totals["sharding_s"] = time.perf_counter() - t
        keys = inst.get_dynamic_partitions(job.partitions_def.name)
        if getattr(_ENGINE["e"], "_llm", None) is not None:  # the server keeps its cache between rounds
            _ENGINE["e"]._llm.reset_prefix_cache()  # type: ignore[attr-defined]
        t = time.perf_counter()
        result = materialize(job.assets, selection=[job.keys["labeled_outputs"], job.keys["run_metrics"]],
                             resources=res, instance=inst, tags={"dagster/asset_partition_range_start": keys[0],
                                                                 "dagster/asset_partition_range_end": keys[-1]})
        seconds = time.perf_counter() - t
        md = result.asset_materializations_for_node("bench__labeled_outputs")[0].metadata
        assert md["rows"].value == len(rows), "pipeline lost rows"
        # The runner's own wall time: the rest of `seconds` is Dagster's run start and finish.
        labeling_s.append(md["wall_s"].value)
        totals.update(shards=len(keys), errors=md["errors"].value,
                      engine_tokens=md["input_tokens"].value + md["output_tokens"].value)
        return seconds

    # Rounds in A-B, B-A order, so a drift of the machine's speed hits both sides alike.
    totals: dict[str, Any] = {}
    raw_times: list[float] = []
    pipe_times: list[float] = []
    labeling_s: list[float] = []
    for n in range(args.repeat):
        if n % 2 == 0:
            raw_times.append(raw())
            pipe_times.append(pipeline(n))
        else:
            pipe_times.append(pipeline(n))
            raw_times.append(raw())
        # Each round as it ends, so a run cut short by a time limit still reports its rounds.
        print(f"round {n}: raw {raw_times[-1]:.2f} s, pipeline {pipe_times[-1]:.2f} s, "
              f"ratio {raw_times[-1] / pipe_times[-1]:.3f}", file=sys.stderr, flush=True)
    raw_s, pipe_s, raw_tokens = sum(raw_times), sum(pipe_times), totals["raw_tokens"] * args.repeat
    out = {
        "mode": args.mode, "model": engine.model_id, "load_format": args.load_format or "auto",
        "rows": len(rows), "shards": totals["shards"], "max_tokens": spec.sampling.max_tokens,
        "machine": machine(), "rounds": args.repeat,
        "engine_start_s": round(engine_start_s, 1), "sharding_s": round(totals["sharding_s"], 2),
        "raw_s": [round(x, 2) for x in raw_times], "pipeline_s": [round(x, 2) for x in pipe_times],
        "raw_tokens": totals["raw_tokens"], "pipeline_engine_tokens": totals["engine_tokens"],
        "errors": totals["errors"],
        "raw_tokens_per_s": round(raw_tokens / raw_s, 1), "pipeline_tokens_per_s": round(raw_tokens / pipe_s, 1),
        "ratio": round(raw_s / pipe_s, 4),
        "labeling_s": [round(x, 2) for x in labeling_s[:args.repeat]],
        "labeling_ratio": round(raw_s / sum(labeling_s[:args.repeat]), 4),
        "prefilled_store_answers": args.prefill_store,
    }
    if args.server:
        # The offline engine goes first: on a GPU both cannot hold 90% of the memory at once.
        res["vllm"].shutdown()
        t = time.perf_counter()
        res["vllm"] = VLLMResource(engine="server", **kw)
        _ENGINE["e"] = res["vllm"].get_engine()
        out["server_start_s"] = round(time.perf_counter() - t, 1)
        server_times = [pipeline(n, "-server") for n in range(args.repeat)]
        out["server_pipeline_s"] = [round(x, 2) for x in server_times]
        out["server_tokens_per_s"] = round(raw_tokens / sum(server_times), 1)
        out["server_vs_offline"] = round(pipe_s / sum(server_times), 4)
    res["vllm"].shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
