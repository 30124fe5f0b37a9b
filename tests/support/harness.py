"""The seeded fault harness (issue 29): several boxes run the real CLI against one home (a shared
folder, or a bucket on moto's S3 server with a cache and a fault proxy per box) while a plan drawn
from a seed kills, pauses, fails and reads; then a clean run finishes the job and the checker
(tests/support/checker.py) reads the home and every box's Dagster instance for the invariants.

    python tests/support/harness.py --seed 7                 # replay one seed: schedule, events, verdict
    python tests/support/harness.py --seed 7 --home folder   # the same draws on a folder home
    PYTHONPATH=.:tests/support python -m benchmarks.fault_harness --episodes 500   # the long run, one file

The plans (what a seed does) are in tests/support/harness_plan.py; every failure names the one command
that replays it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from checker import Break, BucketView, EpisodeRecord, FolderView, Generation, ProcRecord, ReadRecord, check  # noqa: E402
from harness_plan import FAULT_KINDS, Plan, Step, input_rows, make_plan, write_input  # noqa: E402
from harness_procs import DEFS, ROOT, TIMEOUT_S, Box, Proc, Verdict, quiet_proxy, replay_command  # noqa: E402
from harness_steps import Steps  # noqa: E402


class Episode(Steps):
    """Runs one plan in ``work`` (an empty folder); ``server``: moto's S3 server, for an S3 home.
    Its steps are :class:`harness_steps.Steps`; here: the set-up, the processes and the end."""

    def __init__(self, plan: Plan, work: Path, server: Any = None, verbose: bool = False, keep: bool = False) -> None:
        self.plan, self.work, self.server, self.verbose, self.keep = plan, work.resolve(), server, verbose, keep
        self.began = time.monotonic()
        self.events: list[str] = []
        self.faults: Counter[str] = Counter()
        self.problems: list[Break] = []
        self.reads: list[ReadRecord] = []
        self.generations: list[Generation] = []
        self.prompts: list[int] = []  # the current input's prompts per shard (engine-fail triggers)
        self.prompts_rows: list[int] = []  # and its rows per shard
        self.spec: Any = None
        self.input = self.work / "in" / "rows.csv"
        self.boxes = {b.name: Box(b.name, self.work / f"box-{b.name}", b.skew_s) for b in plan.boxes}
        self.launches = 0
        if plan.home == "s3":
            from faults import FaultProxy

            self.bucket = server.new_bucket("harness")
            self.url = f"s3://{self.bucket}/jobs/things"
            # moto answers a GET racing a PUT of the same key with an empty body and the new object's
            # checksum; the view reads attempt records while runs rewrite them, so it does not
            # validate response checksums (the boxes do, and retry: home/bucket.py).
            self.view: Any = BucketView(server.fs(config_kwargs={"response_checksum_validation": "when_required"}),
                                        f"{self.bucket}/jobs/things")
            for b in plan.boxes:
                box = self.boxes[b.name]
                box.proxy = quiet_proxy(FaultProxy(server.endpoint_url))
                if b.faults:
                    box.proxy.set(**b.faults)
        else:
            self.url = str(self.work / "home")
            self.view = FolderView(self.work / "home")

    # -- set-up -----------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        line = f"t+{time.monotonic() - self.began:6.1f}s {text}"
        self.events.append(line)
        if self.verbose:
            print(line, file=sys.stderr, flush=True)

    def setup(self) -> None:
        for box in self.boxes.values():
            box.dagster_home.mkdir(parents=True)
            (box.dagster_home / "dagster.yaml").write_text("")  # the default instance, said so (no warning)
        self.input.parent.mkdir(parents=True)
        params = {"input": str(self.input), "shards": self.plan.shards, "home": self.url, "lease_s": self.plan.lease_s,
                  "delay_s": self.plan.delay_s,
                  "cascade": [{"below": 0.5}, {"model": "fake-big"}] if self.plan.cascade else []}
        (self.work / "params.json").write_text(json.dumps(params))
        (self.work / "defs.py").write_text(DEFS)
        if self.plan.cascade and self.plan.rows:  # rows for the second model to answer
            self.faults["cascade"] += 1
        self.new_generation(empty=False)

    def new_generation(self, empty: bool) -> None:
        """Write the next version of the input and work out, in a scratch folder, the output version
        a run of it makes and its prompts per shard."""
        n = len(self.generations)
        rows = input_rows(self.plan, n, self.generations[-1].rows if self.generations else None, empty)
        write_input(self.input, rows)
        version = self.scratch_shards(n)
        self.generations.append(Generation(n, rows, version))
        ids = [r for r, _ in rows]
        if len(set(ids)) < len(ids) or None in ids:
            self.faults["hostile_ids"] += 1
        if 0 in self.prompts_rows:
            self.faults["empty_shards"] += 1
        if n:
            self.faults["reshard"] += 1
        self.log(f"input v{n} written: {len(rows)} rows, output version {version}, rows per shard "
                 f"{self.prompts_rows}")

    def scratch_shards(self, n: int) -> str | None:
        import pyarrow.parquet as pq

        from sparkbatch_dagster.spec.prompts import check_text
        from sparkbatch_dagster.testing import FakeVLLMResource

        scratch = self.work / f"scratch-v{n}"
        scratch.mkdir()
        params = json.loads((self.work / "params.json").read_text())
        (scratch / "params.json").write_text(json.dumps({**params, "home": str(scratch / "home")}))
        namespace: dict[str, Any] = {"__file__": str(scratch / "defs.py")}
        exec(compile(DEFS, str(scratch / "defs.py"), "exec"), namespace)  # noqa: S102 - our own defs text
        job = namespace["job"]
        self.spec = job.spec
        from sparkbatch_dagster.inputs.shards import build_shards

        quiet = logging.getLogger("sparkbatch")
        level, quiet.level = quiet.level, logging.ERROR  # its warnings (empty shards) are the boxes' to give
        try:
            manifest = build_shards(job.spec, job.home)
        except Exception as exc:  # the boxes will meet it too; the checker reports what follows
            self.log(f"input v{n} cannot be sharded: {type(exc).__name__}: {exc}")
            self.prompts, self.prompts_rows = [], []
            return None
        finally:
            quiet.level = level
        tables = [pq.read_table(job.home.shard_path(k)).to_pylist() for k in manifest["keys"]]
        self.prompts_rows = [len(t) for t in tables]
        self.prompts = [len({r["text"] for r in t if not r.get("_input_error") and not check_text(
            r["text"], "text", job.spec.max_input_chars)}) for t in tables]
        return str(job.output_version(FakeVLLMResource()))  # a cascade's too

    # -- processes --------------------------------------------------------------------------------

    def env(self, box: Box, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKBATCH_FAILPOINT", "T_", "H_"))}
        # The repo first; a PYTHONPATH already set (a site folder carried to another machine) after it.
        path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)
        env.update(PYTHONPATH=path, DAGSTER_HOME=str(box.dagster_home), T_CACHE=str(box.cache),
                   SPARKBATCH_CACHE_DIR=str(self.work / "digests"), SPARKBATCH_CLOCK_SKEW_S=str(box.skew_s))
        if self.server is not None:
            env.update(self.server.env())
            env["AWS_ENDPOINT_URL"] = box.proxy.url
        env.update(extra)
        return env

    def start(self, step: Step, final: bool = False) -> None:
        box = self.boxes[str(step.box)]
        if box.run is not None:
            self.wait(box)
        self.launches += 1
        trace, err = self.work / "traces" / f"{box.name}-{self.launches}.txt", self.work / "logs" / f"{box.name}-" \
            f"{self.launches}.err"
        trace.parent.mkdir(exist_ok=True)
        err.parent.mkdir(exist_ok=True)
        extra = {"T_TRACE": str(trace)}
        fail = step.fail_after
        if isinstance(fail, tuple):  # right after shard m's last answer, on a home where nothing is done yet
            fail = sum(self.prompts[: fail[1]])
        if fail is not None:
            extra["T_FAIL_AFTER"] = str(fail)
        if step.failpoint:
            extra["SPARKBATCH_FAILPOINT"] = step.failpoint
        gate = None
        if step.gate_after is not None:
            gate = self.work / "gates" / f"{box.name}-{self.launches}"
            gate.parent.mkdir(exist_ok=True)
            extra.update(T_GATE_PATH=str(gate), T_GATE_AFTER=str(step.gate_after))
        with err.open("wb") as fh:
            popen = subprocess.Popen([sys.executable, "-m", "sparkbatch_dagster.cli", "run", "-f",
                                      str(self.work / "defs.py")], env=self.env(box, **extra), cwd=box.dir,
                                     stdout=subprocess.DEVNULL, stderr=fh)
        box.procs.append(Proc(box.name, popen, trace, err, final, step.failpoint, fail, gate))
        what = f" (engine fails after {fail} answers)" if fail is not None else ""
        what += f" (engine holds after {step.gate_after} answers)" if gate is not None else ""
        what += f" (SPARKBATCH_FAILPOINT={step.failpoint})" if step.failpoint else ""
        self.log(f"{'final clean run' if final else 'run'} started on {box.name}, pid {popen.pid}{what}")

    def wait(self, box: Box, timeout: float = TIMEOUT_S) -> None:
        proc = box.procs[-1] if box.procs else None
        if proc is None:
            return
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.problems.append(Break("finished", f"box {box.name}'s run (pid {proc.popen.pid}) still running after "
                                                   f"{timeout:.0f} s: killed"))
            proc.popen.kill()
            proc.popen.wait()
        self.ended(proc)

    def ended(self, proc: Proc) -> None:
        rc = proc.popen.returncode
        if proc.logged:
            return
        proc.logged = True
        how = "killed by its failpoint" if rc == -signal.SIGKILL and not proc.killed_by_us else f"exit {rc}"
        if rc == -signal.SIGKILL and not proc.killed_by_us:
            self.faults["failpoint_kill"] += 1
        if "fake engine died" in (proc.err.read_text(errors="replace") if proc.err.exists() else ""):
            self.faults["engine_fail"] += 1
        self.log(f"{proc.box}'s run (pid {proc.popen.pid}) ended: {how} after {proc.answers()} answers"
                 + (f": {proc.tail()}" if rc else ""))

    # -- the end ----------------------------------------------------------------------------------

    def finish(self) -> None:
        for box in self.boxes.values():
            if box.run is not None and box.run.gate is not None:
                box.run.gate.touch()
        for box in self.boxes.values():
            if box.run is not None and box.run.stopped():  # a failpoint stop no step released
                box.run.popen.send_signal(signal.SIGCONT)
                self.log(f"SIGCONT {box.name} (left stopped by its failpoint)")
            self.wait(box)
        for box in self.boxes.values():
            if box.proxy is not None:
                for kind, name in (("errors", "store_5xx"), ("drops", "store_drop"),
                                   ("drops_after_upstream", "store_lost_reply"), ("delays", "store_delay"),
                                   ("slow", "store_slow")):
                    self.faults[name] += box.proxy.counts[kind]
                box.proxy.clear()
        if any(box.skew_s for box in self.boxes.values()):
            self.faults["clock_skew"] += 1
        self.drain()  # a slow PUT of a run that ended lands (or not) before the pointer is judged
        self.check_current()
        if self.plan.damage:
            self.damage(self.plan.damage, self.boxes[self.plan.final_box])
        self.start(Step("start", self.plan.final_box), final=True)
        final = self.boxes[self.plan.final_box]
        self.wait(final)
        proc = final.procs[-1]
        if proc.popen.returncode != 0:
            self.problems.append(Break("finished", f"the final clean run on {final.name} exited "
                                                   f"{proc.popen.returncode}: {proc.tail()}"))

    def record(self) -> EpisodeRecord:
        procs = [ProcRecord(p.box, p.popen.pid, str(self.boxes[p.box].cache), p.popen.returncode, p.answers(),
                            p.popen.returncode == -signal.SIGKILL, p.final, p.tail())
                 for b in self.boxes.values() for p in b.procs]
        return EpisodeRecord(self.plan.home, self.view, self.spec, self.generations, procs, self.reads,
                             {n: str(b.dagster_home) for n, b in self.boxes.items()}, self.problems)

    def close(self) -> None:
        for box in self.boxes.values():
            for proc in box.procs:
                if proc.alive():
                    proc.popen.kill()
                    proc.popen.wait()
            if box.proxy is not None:
                box.proxy.stop()
        if self.server is not None and not self.keep:  # moto keeps every bucket in memory
            try:
                self.server.fs().rm(self.bucket, recursive=True)
            except OSError as exc:
                self.log(f"could not remove bucket {self.bucket}: {exc}")

    def play(self) -> Verdict:
        try:
            self.setup()
            for n, step in enumerate(self.plan.steps, 1):
                self.log(f"step {n}: {step.describe()}")
                self.do(step)
            self.finish()
            breaks, notes = check(self.record())
        finally:
            self.close()
        return Verdict(self.plan.seed, self.plan.home, breaks, notes, self.faults, self.plan.describe(), self.events,
                       time.monotonic() - self.began)


def run_seed(seed: int, home: str | None = None, server: Any = None, work: Path | None = None,
             keep: bool = False, verbose: bool = False) -> Verdict:
    """Play the episode of ``seed`` and check it. An S3 home needs ``server`` (tests/support/s3_server.py)."""
    plan = make_plan(seed, home)
    folder = Path(tempfile.mkdtemp(prefix=f"harness-{seed}-", dir=work))
    try:
        return Episode(plan, folder, server if plan.home == "s3" else None, verbose, keep).play()
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay one seed of the fault harness and print its verdict.")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--home", choices=["s3", "folder"], help="default: the seed's own draw")
    parser.add_argument("--keep", action="store_true", help="keep the episode's folder (homes, logs, traces)")
    parser.add_argument("--plan", action="store_true", help="print the schedule only; run nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no events on stderr while it runs")
    args = parser.parse_args(argv)
    plan = make_plan(args.seed, args.home)
    if args.plan:
        print("\n".join(plan.describe()))
        print(f"fault kinds: {sorted(plan.kinds())}")
        return 0
    server = None
    if plan.home == "s3":
        from s3_server import S3Server

        server = S3Server.start()
    try:
        if not args.quiet:
            print("\n".join(plan.describe()), file=sys.stderr, flush=True)
        verdict = run_seed(args.seed, args.home, server, keep=args.keep, verbose=not args.quiet)
    finally:
        if server is not None:
            server.stop()
    print(verdict.report())
    return 0 if verdict.ok else 1


__all__ = ["FAULT_KINDS", "Episode", "Verdict", "make_plan", "replay_command", "run_seed"]

if __name__ == "__main__":
    sys.exit(main())
