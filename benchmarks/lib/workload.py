"""The job every one-engine benchmark here runs, and the engine it runs on: synthetic or Debian
rows, the job spec built from them, the options (``arg_parser``), the engine started once and kept
warm (``set_up``), and what a result file says about the model (``shape_of``, ``vllm_version``).

``throughput.py`` runs it raw and through the pipeline; ``gpu/``, ``server/batch_file``,
``server/server_client``, ``store/bucket_home`` and ``overhead`` run the same job their own way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.server_arms import json_object
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource
from sparkbatch_dagster.engines.base import Engine

ROOT = Path(__file__).resolve().parents[2]

#: The Debian set: ../shared here; on a GPU box, the copy benchmarks/runners/make_bench_dir.sh puts in .bench.
DEBIAN = next((p for p in (ROOT.parent / "shared" / "data" / "debian_packages.parquet",
                           ROOT / ".bench" / "debian_packages.parquet") if p.exists()),
              ROOT.parent / "shared" / "data" / "debian_packages.parquet")
#: The engine of the round running: ``set_up``'s, then a server variant's (``server_arms.run_server_variants``).
ENGINE: dict[str, Engine] = {}


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
    if args.mode == "summary":  # the first line of a Debian description is the package's summary
        rows = [{**r, "description": (r["description"] or "").split("\n")[0]} for r in rows]
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


def conversations(spec: JobSpec, rows: list[dict[str, Any]]) -> list[list[dict[str, str]]]:
    from sparkbatch_dagster.spec.prompts import render

    return [render(spec.system_prompt, spec.user_template, {c: r[c] for c in spec.text_columns}).messages()
            for r in rows]


def arg_parser(doc: str | None, mode: str, rows: int) -> argparse.ArgumentParser:
    """The job and engine options every benchmark here shares."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    p.add_argument("--mode", choices=["synthetic", "debian", "summary"], default=mode,
                   help="summary: the Debian set's one-line summaries (short prompts) -> section")
    p.add_argument("--rows", type=int, default=rows)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--model", default=None, help="HF folder; default: the embedded SmolLM2")
    p.add_argument("--load-format", default=None, help="'dummy': random weights of the model's shape")
    p.add_argument("--gpu", action="store_true", help="GPU settings (0.9 memory, 1024 seqs)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--home", default=None)
    p.add_argument("--data", default=str(DEBIAN), help="the Debian parquet (debian mode)")
    p.add_argument("--engine-kwargs", default=None, metavar="JSON",
                   help='more VLLMResource.engine_kwargs, e.g. \'{"quantization": "fp8"}\'')
    p.add_argument("--resource", type=json_object, default=None, metavar="JSON",
                   help='VLLMResource fields for every arm, e.g. \'{"label_decoding": "grammar"}\'')
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
    kw["data_parallel_size"] = 1  # one engine in this process, on one GPU (data_parallel.py compares N)
    if args.load_format:
        kw["engine_kwargs"] = {"load_format": args.load_format}
    kw.update(getattr(args, "resource", None) or {})
    if getattr(args, "engine_kwargs", None):
        kw["engine_kwargs"] = {**kw.get("engine_kwargs", {}), **json.loads(args.engine_kwargs)}
    if getattr(args, "trace", False) or getattr(args, "sample", False):  # vLLM's step metrics and /metrics need stats
        kw["engine_kwargs"] = {**kw.get("engine_kwargs", {}), "disable_log_stats": False}
    if getattr(args, "alongside", None):  # two engines on one GPU: equal KV caches, half the memory each at most
        share = 0.3 if getattr(args, "server_b", None) else 0.45  # --server-b: three engines
        kw.update(kv_cache_memory_gb=args.alongside, gpu_memory_utilization=share)
    started = time.perf_counter()
    engine = ENGINE["e"] = VLLMResource(**kw).get_engine()
    return spec, kw, engine, time.perf_counter() - started


def shape_of(model_id: str) -> str:
    """The model's name without its identity hash: ``llama-1b`` (a dummy-weight shape from
    ``make_dummy_model.py``), ``SmolLM2-135M-Instruct``."""
    return model_id.split("@")[0]


def vllm_version() -> str | None:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
