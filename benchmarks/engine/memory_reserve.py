"""What the default ``memory_reserve_gb`` has to cover besides the OS: a ``sparkbatch run``
process without its engine, and Dagster's own processes.

    python -m benchmarks.engine.memory_reserve --out benchmarks/results/cpu-memory-reserve.json
    python -m benchmarks.engine.memory_reserve --rows 2000 --no-dagster-dev   # quicker

(1) ``sparkbatch run -f <defs>`` in a fresh process on a job of ``--rows`` rows with the fake
engine (``FakeVLLMResource``: no model, no vLLM), as a user runs it: its peak RSS (the largest
process of its tree, ``ru_maxrss``) and the peak of its tree's summed RSS, sampled every 0.1 s.
(2) ``dagster dev`` (webserver, daemon, code server) on the same definitions, idle once its
webserver answers: its tree's summed RSS. The OS's share on DGX OS is not measurable here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import emit

ROOT = Path(__file__).resolve().parents[2]


MIB = 2**20

DEFS = '''
import pyarrow as pa, pyarrow.parquet as pq
from pathlib import Path
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, SamplingSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource

src = Path({root!r}) / "rows.parquet"
if not src.exists():
    pq.write_table(pa.Table.from_pylist([{{"id": f"id-{{i:07d}}", "text": f"Package {{i}} does useful things.",
                                          "gold": ("a", "b", "c")[i % 3]}} for i in range({rows})]), src)
spec = JobSpec(name="reserve", input=str(src), id_column="id", text_columns=["text"], user_template="{{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["a", "b", "c"]), sampling=SamplingSpec(max_tokens=4),
               shard_count=8, gold_column="gold", home={home!r})
vllm = FakeVLLMResource()
job = build_batch_assets(spec=spec, resource=vllm)
defs = Definitions(assets=job.assets, resources={{"vllm": vllm}})
'''


def tree_rss(pid: int) -> int:
    """Summed RSS of a process and its live descendants, in bytes (0 once it is gone)."""
    import psutil

    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def run_process(defs: Path, env: dict[str, str]) -> dict[str, float]:
    """``sparkbatch run`` in a child: its own peak RSS and its tree's sampled peak, in MiB."""
    cmd = [sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f", str(defs)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"sparkbatch run failed: {err.decode()[-2000:]}")
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    return {"run_peak_rss_mb": round(largest / MIB), "run_tree_peak_rss_mb": round(peak / MIB)}


def dagster_dev(defs: Path, env: dict[str, str], settle_s: float) -> dict[str, float]:
    """``dagster dev`` on ``defs``, idle once its webserver answers: its tree's RSS in MiB."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("dagster")
    proc = subprocess.Popen([str(exe), "dev", "-f", str(defs), "-p", str(port)], cwd=defs.parent, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info",  # noqa: S310
                                                                      timeout=2):
                break
            time.sleep(1)
        else:
            raise SystemExit("dagster dev did not answer in 300 s")
        time.sleep(settle_s)  # the daemon and the code server finish starting
        samples = []
        for _ in range(10):
            samples.append(tree_rss(proc.pid))
            time.sleep(0.5)
        return {"dagster_dev_rss_mb": round(max(samples) / MIB)}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--no-dagster-dev", action="store_true")
    ap.add_argument("--out", default=None, help="also write the result object to this file")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sparkbatch-reserve-"))
    defs = tmp / "defs.py"
    defs.write_text(DEFS.format(root=str(tmp), rows=args.rows, home=str(tmp / "home")))
    env = {**os.environ, "DAGSTER_HOME": str(tmp / "dagster_home"), "PYTHONPATH": str(ROOT)}
    (tmp / "dagster_home").mkdir()
    result = {"benchmark": "memory_reserve", "machine": machine(cpu_only=True),
              "rows": args.rows, "engine": "fake (FakeVLLMResource)", **run_process(defs, env)}
    if not args.no_dagster_dev:
        result.update(dagster_dev(defs, env, args.settle_s))
    emit(result, args.out)


if __name__ == "__main__":
    main()
