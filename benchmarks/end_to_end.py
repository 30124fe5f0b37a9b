"""`sparkbatch run` end to end against a plain vLLM script on the same small job, side by side.

    python -m benchmarks.end_to_end                  # 600 Debian rows, one shard, 2 rounds A-B / B-A
    python -m benchmarks.end_to_end --rows 300 --rounds 1 --out benchmarks/results/x.json
    python -m benchmarks.end_to_end --before f414a2a # also time that commit's `sparkbatch run`, same rounds

Both are fresh processes timed from launch to exit, as a user would time them:
(a) plain: a script that starts ``vllm.LLM`` (embedded SmolLM2, the CPU profile's settings) and
    calls ``LLM.chat`` once over every row with the same prompts and structured outputs;
(b) sparkbatch: ``sparkbatch run -f defs.py`` on the same rows in a fresh job home and Dagster
    home (sharding, labeling, checkpoints, metrics, analytics, its JSON summary).
(c) with ``--before REF``: the same ``sparkbatch run`` from commit REF of this repository (checked
    out into a temporary folder and put first on PYTHONPATH), for a before/after in one run.
Prints one JSON line; the summary's own timings for (b) are kept too (``timings_s``: startup,
shard, label with the engine start, metrics, analytics).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[1]


SYSTEM = "You sort Debian packages into archive sections. Allowed sections: {sections}."
USER = "Package: {{ package }}\nDescription: {{ description }}\n\nWhich section is this package in?"
PLAIN = """
import json, sys
import pyarrow.parquet as pq
from jinja2 import Template
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
src, model, system, user, labels = sys.argv[1:6]
labels = json.loads(labels)
rows = pq.read_table(src).to_pylist()
tpl = Template(user)
convs = [[{"role": "system", "content": system}, {"role": "user", "content": tpl.render(**r)}] for r in rows]
if __name__ == "__main__":
    llm = LLM(model=model, gpu_memory_utilization=0.3, max_num_seqs=256, max_model_len=2048)
    params = SamplingParams(max_tokens=8, temperature=0.0, structured_outputs=StructuredOutputsParams(choice=labels))
    outs = llm.chat(convs, params, use_tqdm=False)
    print(json.dumps({"rows": len(outs)}))
"""
DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets
job = build_batch_assets(spec=JobSpec(name="e2e", input={src!r}, id_column="package",
    text_columns=["package", "description"], system_prompt={system!r}, user_template={user!r},
    output=OutputSpec(kind="label", labels={labels!r}), sampling=SamplingSpec(max_tokens=8), shard_count=1,
    gold_column="section", home={home!r}))
defs = Definitions(assets=job.assets, resources={{"vllm": VLLMResource(gpu_memory_utilization=0.3, max_num_seqs=256,
                                                                      max_model_len=2048)}})
"""


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {proc.stderr[-2000:]}")
    return seconds, proc.stdout.strip().splitlines()[-1]


def main() -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from assets.debian import SECTIONS
    from sparkbatch_dagster.engines.platform.model import ensure_embedded

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/debian_packages.parquet"))
    ap.add_argument("--out")
    ap.add_argument("--before", help="a git ref of this repo whose `sparkbatch run` is timed too (before/after)")
    args = ap.parse_args()
    model = str(ensure_embedded("SmolLM2-135M-Instruct"))
    system = SYSTEM.format(sections=", ".join(SECTIONS))
    sides = ["plain", "sparkbatch", *(["before"] if args.before else [])]
    runs: dict[str, list[float]] = {side: [] for side in sides}
    summaries: dict[str, list[dict]] = {"sparkbatch": [], "before": []}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "rows.parquet"
        table = pq.read_table(args.data, columns=["package", "section", "description"]).slice(0, args.rows)
        pq.write_table(pa.Table.from_pylist(table.to_pylist()), src)
        roots = {"sparkbatch": ROOT}
        if args.before:
            roots["before"] = Path(tmp) / "before"
            roots["before"].mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(roots["before"])], input=archive.stdout, check=True)
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                env = {**os.environ, "PYTHONPATH": str(roots.get(side, ROOT))}
                if side == "plain":
                    cmd = [sys.executable, "-c", PLAIN, str(src), model, system, USER, json.dumps(SECTIONS)]
                    seconds, _ = timed(cmd, env, Path(tmp))
                else:
                    home = Path(tmp) / f"{side}{r}"
                    home.mkdir()
                    defs = home / "defs.py"
                    defs.write_text(DEFS.format(src=str(src), system=system, user=USER, labels=SECTIONS,
                                                home=str(home / "job")))
                    cmd = [sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(defs)]
                    seconds, line = timed(cmd, {**env, "DAGSTER_HOME": str(home / "dagster")}, home)
                    summaries[side].append(json.loads(line))
                runs[side].append(round(seconds, 1))
                print(json.dumps({"round": r, "side": side, "seconds": round(seconds, 1)}), file=sys.stderr, flush=True)
    plain, ours = statistics.median(runs["plain"]), statistics.median(runs["sparkbatch"])
    result = {"benchmark": "end_to_end", "machine": machine(), "rows": args.rows, "shards": 1,
              "model": "SmolLM2-135M-Instruct", "rounds": args.rounds, "plain_s": runs["plain"],
              "sparkbatch_s": runs["sparkbatch"], "plain_median_s": plain, "sparkbatch_median_s": ours,
              "sparkbatch_over_plain": round(ours / plain, 3),
              "sparkbatch_labeling_s": [s["wall_s"] for s in summaries["sparkbatch"]],
              "sparkbatch_engine_start_s": [s.get("engine_start_s") for s in summaries["sparkbatch"]],
              "sparkbatch_timings_s": [s.get("timings_s") for s in summaries["sparkbatch"]]}
    if args.before:
        before = statistics.median(runs["before"])
        result.update(before_ref=args.before, before_s=runs["before"], before_median_s=before,
                      before_over_plain=round(before / plain, 3),
                      before_labeling_s=[s.get("wall_s") for s in summaries["before"]])
    emit(result, args.out)


if __name__ == "__main__":
    main()
