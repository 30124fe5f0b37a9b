"""The fault harness's pieces (tests/support/harness.py plays them): the job each box runs, the
read-only command with its audit hook, a box and its processes, and an episode's verdict."""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checker import Break

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240.0  # a run that takes longer is hung (a liveness break), not slow: they take seconds

DEFS = """
import json, os
from pathlib import Path
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource

P = json.loads((Path(__file__).parent / "params.json").read_text())
spec = JobSpec(name="things", input=P["input"], id_column="id", text_columns=["text"],
               user_template="What is this? {{ text }}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]),
               shard_count=P["shards"], home=P["home"], cache_dir=os.environ.get("T_CACHE"),
               lease_seconds=P["lease_s"], checkpoint_rows=10, checkpoint_seconds=0.3, cascade=P.get("cascade") or [])
job = build_batch_assets(spec=spec)
fake = {"delay_s": P["delay_s"], "trace_path": os.environ.get("T_TRACE")}
if os.environ.get("T_FAIL_AFTER"):
    fake["fail_after"] = int(os.environ["T_FAIL_AFTER"])
if os.environ.get("T_GATE_PATH"):
    fake.update(gate_path=os.environ["T_GATE_PATH"], gate_after=int(os.environ["T_GATE_AFTER"]))
defs = Definitions(assets=job.assets, resources={"vllm": FakeVLLMResource(**fake)})
"""

#: A read-only command with an audit hook: every file it opens for writing, renames onto, or
#: removes under the watched roots is logged, with the flocks it holds exclusively at that moment.
READER = r"""
import fcntl, json, os, sys
ROOTS = tuple(json.loads(os.environ["H_ROOTS"]))
LOG = open(os.environ["H_AUDIT"], "a", buffering=1)
EXCL = {}
def note(op, path, **kw):
    path = os.path.abspath(os.fsdecode(path))
    if path.startswith(ROOTS):
        LOG.write(json.dumps({"op": op, "path": path, "exclusive": sorted(EXCL.values()), **kw}) + "\n")
def hook(event, args):
    try:
        if event == "open" and isinstance(args[0], (str, bytes)):
            mode, flags = args[1], args[2] or 0
            if (mode and any(c in mode for c in "wax+")) or (
                    mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                note("write", args[0])
        elif event == "os.rename":
            note("replace", args[1], existed=os.path.exists(args[1]))
        elif event in ("os.remove", "shutil.rmtree"):
            note("remove", args[0])
        elif event == "fcntl.flock":
            fd, op = args
            if op & fcntl.LOCK_EX:
                EXCL[fd] = os.readlink(f"/proc/self/fd/{fd}")
            else:
                EXCL.pop(fd, None)
    except Exception:
        pass
sys.addaudithook(hook)
cmd, defs = sys.argv[1], sys.argv[2]
if cmd == "read_outputs":
    from sparkbatch_dagster.cli.locate import load
    job, _ = load(defs, None)
    print(json.dumps({"rows": job.read_outputs().num_rows}))
else:
    from sparkbatch_dagster.cli import main
    extra = {"sql": ["SELECT 42 AS answer"], "preview": ["-n", "1"]}.get(cmd, [])
    sys.exit(main([cmd, "-f", defs, *extra]))
"""


def quiet_proxy(proxy: Any) -> Any:
    """A FaultProxy that does not print a traceback when a client it serves is SIGKILLed mid-request
    (the harness does that on purpose)."""
    proxy._server.handle_error = lambda request, address: None
    return proxy


def replay_command(seed: int, home: str) -> str:
    return f"python tests/support/harness.py --seed {seed} --home {home}"


@dataclass
class Verdict:
    seed: int
    home: str
    breaks: list[Break]
    notes: list[str]
    faults: Counter[str]
    schedule: list[str]
    events: list[str]
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.breaks

    @property
    def replay(self) -> str:
        return replay_command(self.seed, self.home)

    def report(self) -> str:
        head = "PASS" if self.ok else f"FAIL: {len(self.breaks)} invariant break(s)"
        lines = [*self.schedule, "events:", *(f"  {e}" for e in self.events),
                 f"faults injected: {dict(sorted(self.faults.items()))}", *(f"note: {n}" for n in self.notes),
                 *(f"BREAK {b}" for b in self.breaks), f"verdict for seed {self.seed} ({self.home}): {head} in "
                 f"{self.wall_s:.0f} s", f"replay: {self.replay}"]
        return "\n".join(lines)


@dataclass
class Proc:
    """One process a box started: a run (or the final run)."""

    box: str
    popen: subprocess.Popen[bytes]
    trace: Path
    err: Path
    final: bool = False
    failpoint: str | None = None
    fail_after: int | None = None
    gate: Path | None = None  # the file that lets its engine go on past its gate
    killed_by_us: bool = False
    self_stopped: bool = False
    logged: bool = False  # its end is in the events

    def answers(self) -> int:
        try:
            return self.trace.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stopped(self) -> bool:
        import psutil

        try:
            return self.alive() and psutil.Process(self.popen.pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return False

    def tail(self) -> str:
        try:
            lines = [x for x in self.err.read_text(errors="replace").splitlines() if x.strip()]
        except FileNotFoundError:
            return ""
        return lines[-1][:300] if lines else ""


@dataclass
class Box:
    name: str
    dir: Path
    skew_s: float
    proxy: Any = None
    procs: list[Proc] = field(default_factory=list)

    @property
    def cache(self) -> Path:
        return self.dir / "cache"

    @property
    def dagster_home(self) -> Path:
        return self.dir / "dagster"

    @property
    def run(self) -> Proc | None:
        return self.procs[-1] if self.procs and self.procs[-1].alive() else None
