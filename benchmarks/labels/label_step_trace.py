"""Where the labeling step's time goes: `sparkbatch run`'s own code path on N rows, its ``label``
lap split into named parts.

    python -m benchmarks.labels.label_step_trace                                   # 40,000 Debian rows, fake engine
    python -m benchmarks.labels.label_step_trace --rows 5000 --synthetic            # no data set needed
    python -m benchmarks.labels.label_step_trace --input my.parquet --id-column id --text-columns title,body
    python -m benchmarks.labels.label_step_trace --profile 30                       # + cProfile's top 30 (slower run)
    python -m benchmarks.labels.label_step_trace --rounds 4 --before /tmp/old       # A-B / B-A against another copy
    python -m benchmarks.labels.label_step_trace --engine vllm --model /models/llama-1b \\
        --out benchmarks/results/h200-1b-label-step-40000.json              # the real engine (a GPU box)

It runs what ``sparkbatch run`` runs (``cli.commands.run``: shard, label, metrics, analytics) in
this process, in a fresh job home (a folder) and a fresh Dagster instance, then prints one JSON
object (``results_io.emit``) with the summary's ``timings_s`` and the ``label`` lap split:

* ``engine_start``: the engine's start as this step waited for it (work that ran while it loaded,
  rendering the next shards say, costs nothing and is not counted again); ``gpu_wait``: a wait
  for another run's engine to free the GPU;
* ``generation``: time inside the engine's stream of answers (the engine generating, with work
  in flight), the run's own work done in between excluded;
* every other part by name: ``run_start`` and ``run_end`` (Dagster's run around the step),
  ``prepare``, ``identity`` (the model's identity), ``bookkeeping`` (claims, the attempt's
  record), ``read_shards``, ``resume``, ``render``, ``prompt_keys``, ``store_lookup``,
  ``tokenize`` (offline vLLM), ``answers``, ``parts`` (checkpoint files), ``commit``,
  ``store_add``, ``events`` (the step's Dagster events and log lines), ``progress``,
  ``engine_stop`` (only where the engine stops inside the step's run: code from before the stop
  moved behind metrics and analytics, whose summary has ``engine_stop_background``, the whole
  stop, and the lap ``engine_stop_wait``, what of it the run still waited for at its end);
* ``unnamed_s``: the ``label`` lap minus all of them (what no span covers);
* ``label_cpu_s``: the process's CPU seconds over the labeling run, and ``step_thread_cpu_s`` the
  step's own thread's per part: steadier than wall seconds on a busy machine.

With ``--rounds N`` each round is a process of its own; the result is the round with the median
``label`` lap (its parts add up), every round's lap and CPU, and each part's median over the
rounds (``median_timings_s``); ``--before DIR`` times another copy in the same rounds, A-B / B-A.

``--ahead-rows 0`` opens no shard ahead while the engine starts (the start and the shards one after
the other, as before the overlap): run it both ways for what the overlap buys on a real engine.
``--engine fake`` (the default) answers at once (``FakeEngine``): what is left is this project's
own overhead. ``--engine vllm`` is ``VLLMResource`` with ``--model`` (and ``--resource`` fields as
JSON, ``--load-format dummy`` for random weights of the model's shape). ``--code DIR`` runs
another copy of this repository (``git archive REF | tar -x -C DIR``): a before/after; a copy
from before the split reports the ``label`` lap alone (and the profile, with ``--profile``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]

DEBIAN = ROOT.parent / "shared" / "data" / "debian_packages.parquet"
#: The laps of ``sparkbatch run``'s summary; every other key of its ``timings_s`` is a part of ``label``.
LAPS = ("startup", "shard", "label", "metrics", "analytics", "engine_stop_wait", "engine_stop_background")


def synthetic_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of about the Debian descriptions' length, every 20th text a repeat (duplicate prompts)."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta river stone cloud metal paper glass tiger maple orbit pixel".split()
    labels = ["admin", "devel", "libs", "net", "text", "utils"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(n)]
    return [{"id": f"s{i:07d}", "text": texts[i - i % 20] if i % 20 == 19 else texts[i], "label": labels[i % 6]}
            for i in range(n)]


def job_spec(args: argparse.Namespace, home: Path) -> Any:
    """The job: Debian sections (the H200 benchmark's), synthetic rows, or any parquet's columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec

    src = home / "input.parquet"
    if args.synthetic:
        table = pa.Table.from_pylist(synthetic_rows(args.rows))
        id_col, texts, gold = "id", ["text"], "label"
    else:
        path = Path(args.input)
        if not path.exists():
            raise SystemExit(f"{path} not found: give --input PATH, or --synthetic for generated rows")
        table = pq.read_table(path)
        table = table.slice(0, args.rows) if args.rows else table
        id_col, gold = args.id_column, args.label_column
        texts = args.text_columns.split(",")
        missing = [c for c in [id_col, *texts, *([gold] if gold else [])] if c not in table.column_names]
        if missing:
            raise SystemExit(f"{path} has no column(s) {missing}: name them with --id-column, --text-columns and "
                             f"--label-column (it has {table.column_names})")
    pq.write_table(table, src)
    labels = sorted({str(v) for v in table.column(gold).to_pylist() if v}) if gold else []
    user = "\n".join(f"{c.capitalize()}: {{{{ {c} }}}}" for c in texts) + "\n\nWhich category is this?"
    output = OutputSpec(kind="label", labels=labels) if labels else OutputSpec(kind="text")
    system = ("You sort items into categories. Allowed: " + ", ".join(labels) + ".") if labels else "Answer briefly."
    return JobSpec(name="trace", input=str(src), id_column=id_col, text_columns=texts, system_prompt=system,
                   user_template=user, output=output, sampling=SamplingSpec(max_tokens=args.max_tokens),
                   shard_count=args.shards, gold_column=gold or None, home=str(home / "job"))


def resource(args: argparse.Namespace) -> Any:
    if args.engine == "fake":
        from sparkbatch_dagster.testing import FakeVLLMResource

        return FakeVLLMResource()
    from sparkbatch_dagster import VLLMResource

    fields: dict[str, Any] = json.loads(args.resource) if args.resource else {}
    if args.model:
        fields["model"] = args.model
    if args.load_format:
        fields["engine_kwargs"] = {**fields.get("engine_kwargs", {}), "load_format": args.load_format}
    return VLLMResource(**fields)


def profile_top(prof: cProfile.Profile, n: int) -> list[dict[str, Any]]:
    """cProfile's top ``n`` functions by own time, and by cumulative time (the run's thread only)."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = file.split("site-packages/")[-1].split("/work/")[-1]
        rows.append({"function": f"{where}:{line}({name})", "calls": calls, "own_s": round(own, 3),
                     "cum_s": round(cum, 3)})
    by_own = sorted(rows, key=lambda r: -r["own_s"])[:n]
    by_cum = sorted(rows, key=lambda r: -r["cum_s"])[:n]
    return [{"by_own": by_own, "by_cum": by_cum}]


def split(timings: dict[str, float]) -> dict[str, Any]:
    parts = {k: v for k, v in timings.items() if k not in LAPS}
    named = round(sum(parts.values()), 2)
    label = timings.get("label") or 0.0
    # Issue 30's measure: what the labeling step costs beyond the engine's start and its generation.
    beyond = label - sum(parts.get(k, 0.0) for k in ("engine_start", "gpu_wait", "generation"))
    return {"label_s": timings.get("label"), "parts_s": parts, "named_s": named,
            "unnamed_s": round(label - named, 2) if parts else None,
            "beyond_start_and_generation_s": round(beyond, 2) if parts else None}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40_000, help="rows of the input (0: all)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--input", default=str(DEBIAN), help="a parquet file (default: the Debian packages)")
    ap.add_argument("--synthetic", action="store_true", help="generated rows: no input file needed")
    ap.add_argument("--id-column", default="package")
    ap.add_argument("--text-columns", default="package,description")
    ap.add_argument("--label-column", default="section", help="gold labels (their values are the labels); '' none")
    ap.add_argument("--engine", choices=["fake", "vllm"], default="fake")
    ap.add_argument("--model", help="--engine vllm: the model folder")
    ap.add_argument("--load-format", help="--engine vllm: 'dummy' for random weights")
    ap.add_argument("--resource", help="--engine vllm: VLLMResource fields as JSON")
    ap.add_argument("--ahead-rows", type=int, help="rows opened ahead while the engine starts (ShardRun.ahead_rows; "
                    "0: none, the start and the shards one after the other; default: the code's)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also cProfile the run: its top N functions")
    ap.add_argument("--code", help="a copy of this repository to run instead (git archive REF | tar -x -C DIR)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, each in its own process; medians reported")
    ap.add_argument("--before", metavar="DIR", help="a copy of this repository timed in the same rounds, "
                    "alternating (A-B, B-A): its label lap next to this code's")
    ap.add_argument("--home", help="folder for the job and Dagster homes (default: a temporary one)")
    ap.add_argument("--note", help="a line kept in the result (what this run is)")
    ap.add_argument("--out", help="also write the result to this file (benchmarks/results/...)")
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    if args.rounds == 1 and not args.before:
        emit(one_round(args), args.out)
        return
    sides = {"after": args.code, **({"before": args.before} if args.before else {})}
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for r in range(args.rounds):
        for side in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            rounds[side].append(_subprocess_round(sides[side]))
            print(json.dumps({"round": r, "side": side, "label_s": rounds[side][-1]["label_s"]}), file=sys.stderr,
                  flush=True)
    result = {**summarize(rounds["after"]), "rounds": args.rounds}
    if args.before:
        before = summarize(rounds["before"])
        result["before"] = {k: before.get(k) for k in ("code", "run_s", "label_s", "round_label_s", "label_cpu_s",
                                                        "round_label_cpu_s", "beyond_start_and_generation_s",
                                                        "parts_s", "timings_s", "median_timings_s")}
        result["label_cut_s"] = round(before["label_s"] - result["label_s"], 2)
        result["run_cut_s"] = round(before["run_s"] - result["run_s"], 2)
    if args.note:
        result["note"] = args.note
    emit(result, args.out)


def _subprocess_round(code: str | None) -> dict[str, Any]:
    """One round in a fresh process (this script, the same arguments, one round, ``code``'s tree)."""
    argv, skip = [], False
    for a in sys.argv[1:]:  # the orchestration's own arguments stay here
        if skip:
            skip = False
            continue
        if a in ("--rounds", "--before", "--out", "--code", "--note"):
            skip = True
            continue
        if a.split("=")[0] in ("--rounds", "--before", "--out", "--code", "--note"):
            continue
        argv.append(a)
    cmd = [sys.executable, "-m", "benchmarks.labels.label_step_trace", *argv, *(["--code", code] if code else [])]
    # ``code``'s tree goes first on the child's path, so its sparkbatch_dagster is the one timed.
    path = [str(Path(code).resolve())] if code else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"a round failed: {proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one side: the median round's object (its ``timings_s`` and split, which add
    up), every round's ``label`` lap and CPU seconds, and each part's median over the rounds."""
    import statistics

    middle = sorted(rounds, key=lambda r: r["label_s"])[(len(rounds) - 1) // 2]
    keys = list(middle["timings_s"])
    medians = {k: round(statistics.median(r["timings_s"].get(k, 0.0) for r in rounds), 2) for k in keys}
    return {**middle, "round_label_s": [r["label_s"] for r in rounds],
            "round_label_cpu_s": [r["label_cpu_s"] for r in rounds], "median_timings_s": medians}


def one_round(args: argparse.Namespace) -> dict[str, Any]:
    code = Path(args.code).resolve() if args.code else ROOT
    import sparkbatch_dagster

    if code not in Path(sparkbatch_dagster.__file__).resolve().parents:
        raise SystemExit(f"--code {code}: its sparkbatch_dagster is not the one imported "
                         f"({sparkbatch_dagster.__file__}); run with PYTHONPATH={code}")
    with tempfile.TemporaryDirectory(dir=args.home) as tmp:
        home = Path(tmp)
        os.environ["DAGSTER_HOME"] = str(home / "dagster")
        (home / "dagster").mkdir()
        from dagster import Definitions

        from sparkbatch_dagster import build_batch_assets
        from sparkbatch_dagster.cli import commands, console

        console.configure(False)
        if args.ahead_rows is not None:
            from sparkbatch_dagster.run.runner import ShardRun

            ShardRun.ahead_rows = args.ahead_rows
        spec = job_spec(args, home)
        engine = resource(args)
        job = build_batch_assets(spec=spec)
        defs = Definitions(assets=job.assets, resources={"vllm": engine})
        runs, step_cpu = _watch()
        prof = cProfile.Profile() if args.profile else None
        began = time.perf_counter()
        if prof is not None:
            prof.enable()
        summary = commands.run(job, defs).to_json()
        if prof is not None:
            prof.disable()
        wall = time.perf_counter() - began
    timings = summary.get("timings_s", {})
    label = next((r for r in runs if r["selection"] == "labeled_outputs"), {})
    result: dict[str, Any] = {
        "benchmark": "label_step", "machine": machine(), "engine": args.engine,
        "model": args.model or "fake-model", "rows": summary.get("rows"), "shards": args.shards,
        "max_tokens": args.max_tokens, "input": "synthetic" if args.synthetic else Path(args.input).name,
        "code": code.name if args.code else _head(), "ahead_rows": args.ahead_rows, "profiled": bool(prof),
        "run_s": round(wall, 2),
        **split(timings), "timings_s": timings,
        # The process's CPU seconds (every thread) over the labeling run, and the step's own thread's per part:
        # steadier than wall seconds on a busy machine.
        "label_cpu_s": label.get("cpu_s"), "step_thread_cpu_s": {k: round(v, 2) for k, v in step_cpu.items()},
        "summary": {k: summary.get(k) for k in ("rows", "labeled", "errors", "generated", "reused", "wall_s",
                                                 "engine_start_s", "engine_starts", "success")},
    }
    if args.note:
        result["note"] = args.note
    if prof is not None:
        result["profile"] = profile_top(prof, args.profile)[0]
    return result


def _watch() -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Wall and process CPU seconds of each ``materialize`` the command makes (by the asset it
    selects), and the labeling step's thread CPU per part (``engines/platform/spans.py``, when it counts)."""
    import dagster

    runs: list[dict[str, Any]] = []
    cpu: dict[str, float] = {}
    plain = dagster.materialize

    def timed(*a: Any, **kw: Any) -> Any:
        selection = kw.get("selection")
        name = "/".join(selection[0].path[-1:]) if isinstance(selection, list) and selection else "upstream"
        wall, began = time.perf_counter(), time.process_time()
        try:
            if spans is None:
                return plain(*a, **kw)
            with spans.collecting() as found:
                result = plain(*a, **kw)
            for step in found.spans:
                for k, v in (step.cpu or {}).items():
                    cpu[k] = cpu.get(k, 0.0) + v
            return result
        finally:
            runs.append({"selection": name, "wall_s": round(time.perf_counter() - wall, 2),
                         "cpu_s": round(time.process_time() - began, 2)})

    try:
        from sparkbatch_dagster.engines.platform import spans
        spans.COUNT_CPU = True
    except ImportError:  # a copy from before the parts were named
        spans = None  # type: ignore[assignment]
    dagster.materialize = timed
    return runs, cpu


def _head() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    main()
