"""The fault harness's steps (tests/support/harness_plan.py's ``Step`` kinds), as :class:`Steps`, which
``harness.Episode`` plays: each waits for its trigger, then does one thing to the boxes, the
store or the input, and writes what it did in the episode's events."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

from checker import Break, ReadRecord
from harness_plan import Plan, Step
from harness_procs import READER, TIMEOUT_S, Box, Proc, quiet_proxy


class Steps:
    """What :class:`harness.Episode` provides the steps with (declared here for the reader)."""

    plan: Plan
    boxes: dict[str, Box]
    server: Any
    view: Any
    work: Any
    faults: Any
    reads: list[ReadRecord]
    problems: list[Break]
    generations: list[Any]

    def log(self, text: str) -> None: ...
    def start(self, step: Step, final: bool = False) -> None: ...
    def wait(self, box: Box, timeout: float = TIMEOUT_S) -> None: ...
    def ended(self, proc: Proc) -> None: ...
    def env(self, box: Box, **extra: str) -> dict[str, str]: ...
    def new_generation(self, empty: bool) -> None: ...

    def wait_answers(self, box_name: str, k: int) -> bool:
        """Wait until the box's run answered ``k`` prompts; False if it ended or stopped first."""
        proc = self.boxes[box_name].run
        deadline = time.monotonic() + TIMEOUT_S
        while proc is not None and proc.alive() and proc.answers() < k and time.monotonic() < deadline:
            if proc.stopped():
                return False
            time.sleep(0.02)
        return proc is not None and proc.alive() and proc.answers() >= k

    def do(self, step: Step) -> None:
        if step.after is not None and not self.wait_answers(*step.after):
            if step.kind in ("kill", "stop", "faults"):  # aimed at that run, which is over
                self.log(f"{step.after[0]}'s run ended before {step.after[1]} answers: skipped")
                return
            self.log(f"{step.after[0]}'s run ended before {step.after[1]} answers: done now")
        getattr(self, f"step_{step.kind}")(step)

    def step_start(self, step: Step) -> None:
        self.start(step)

    def step_wait(self, step: Step) -> None:
        self.wait(self.boxes[str(step.box)])

    def step_wait_all(self, step: Step) -> None:
        for box in self.boxes.values():
            self.wait(box)

    def step_kill(self, step: Step) -> None:
        proc = self.boxes[str(step.box)].run
        if proc is None:
            return
        proc.killed_by_us = True
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait()
        self.faults["sigkill"] += 1
        self.log(f"SIGKILL {proc.box} (pid {proc.popen.pid}) after {proc.answers()} answers")
        self.ended(proc)

    def step_stop(self, step: Step) -> None:
        proc = self.boxes[str(step.box)].run
        if proc is None:
            return
        proc.popen.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not proc.stopped() and proc.alive() and time.monotonic() < deadline:
            time.sleep(0.01)  # the signal is delivered when the process is next scheduled
        self.faults["sigstop"] += 1
        self.log(f"SIGSTOP {proc.box} (pid {proc.popen.pid}) after {proc.answers()} answers")

    def step_await_stop(self, step: Step) -> None:
        proc = self.boxes[str(step.box)].run
        deadline = time.monotonic() + TIMEOUT_S
        while proc is not None and proc.alive() and not proc.stopped() and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc is not None and proc.stopped():
            proc.self_stopped = True
            self.faults["failpoint_stop"] += 1
            self.log(f"{proc.box} (pid {proc.popen.pid}) stopped itself at its failpoint, {proc.answers()} answers in")
        elif proc is not None:
            self.log(f"{proc.box}'s run never reached its failpoint")

    def step_hold(self, step: Step) -> None:
        """Keep a stopped box stopped past its lease: until another box committed a shard it had
        claimed (and at least 1.5 leases passed), or no other run is left to take one over."""
        proc = self.boxes[str(step.box)].run
        if proc is None:
            return
        lease, began = self.plan.lease_s, time.monotonic()
        claimed = self.claims_of(proc.popen.pid)
        done_before = self.committed(claimed)
        while True:
            held = time.monotonic() - began
            others = [b.run for b in self.boxes.values() if b.run is not None and b.run is not proc]
            taken = bool(self.committed(claimed - done_before))
            if held >= 1.5 * lease and (taken or not [p for p in others if p and not p.stopped()]):
                break
            if held >= 12 * lease + 30:
                break
            time.sleep(0.25)
        proc.popen.send_signal(signal.SIGCONT)
        self.log(f"SIGCONT {proc.box} after {held:.1f} s stopped ({held / lease:.1f} leases); it had claimed "
                 f"{sorted(claimed) or 'nothing'}, {'one' if taken else 'none'} of them committed elsewhere since")

    def claims_of(self, pid: int) -> set[str]:
        """Shard claims (``leases/<version>/<key>.json``) naming this process, with a bucket home."""
        if self.plan.home != "s3":
            return set()
        out = set()
        for n in self.view.names():
            if n.startswith("leases/") and not n.startswith("leases/boxes/"):
                try:
                    body = json.loads(self.view.read(n))
                except (FileNotFoundError, ValueError):
                    continue
                if f":{pid}:" in str(body.get("owner", "")):
                    out.add(n)
        return out

    def committed(self, claims: set[str]) -> set[str]:
        """Of these claims (``leases/<version>/<key>.json``), those whose shard has a commit now."""
        if not claims:
            return set()
        names = self.view.names()
        return {c for c in claims if "out/{1}/commits/{2}".format(*c.split("/")) in names}

    def step_open(self, step: Step) -> None:
        proc = self.boxes[str(step.box)].run
        if proc is not None and proc.gate is not None:
            proc.gate.touch()
            self.log(f"{proc.box}'s gate opened after {proc.answers()} answers")

    def step_reshard(self, step: Step) -> None:
        self.new_generation(step.empty)

    def step_faults(self, step: Step) -> None:
        proxy = self.boxes[str(step.box)].proxy
        if proxy is not None and step.faults:
            box = next(b for b in self.plan.boxes if b.name == step.box)
            slow = {k: v for k, v in (box.faults or {}).items() if k.startswith(("slow_", "max_slow"))}
            proxy.set(**{**slow, **step.faults})  # a burst on top of a slow store, which stays
            self.log(f"store faults on {step.box}: {step.faults}")

    def step_read(self, step: Step) -> None:
        from faults import FaultProxy

        box, cmd = self.boxes[str(step.box)], str(step.cmd)
        running = [b.run for b in self.boxes.values() if b.run is not None and not b.run.stopped()]
        quiet = not running
        # Held at its gate, the box's run is certainly labeling: its shard files are in use.
        busy = box.run is not None and box.run.gate is not None and not box.run.gate.exists()
        self.drain()
        before = self.view.digest() if quiet else None
        audit = self.work / "logs" / f"read-{len(self.reads)}-{cmd}.audit"
        audit.parent.mkdir(exist_ok=True)
        roots = [str(box.cache)] if self.plan.home == "s3" else [str(self.work / "home")]
        proxy = quiet_proxy(FaultProxy(self.server.endpoint_url)) if self.server is not None else None
        extra = {"H_AUDIT": str(audit), "H_ROOTS": json.dumps(roots)}
        env = self.env(box, **extra)
        if proxy is not None:
            env["AWS_ENDPOINT_URL"] = proxy.url
        try:
            done = subprocess.run([sys.executable, "-c", READER, cmd, str(self.work / "defs.py")], env=env,
                                  cwd=box.dir, capture_output=True, text=True, timeout=TIMEOUT_S)
            rc, tail = done.returncode, (done.stderr.strip().splitlines() or [""])[-1][:300]
        except subprocess.TimeoutExpired:
            rc, tail = None, "timed out"
        writes = [(m, p) for m, p, _ in proxy.log if m in ("PUT", "POST", "DELETE")] if proxy is not None else []
        if proxy is not None:
            proxy.stop()
        after = None
        if quiet:
            self.drain()
            after = self.view.digest()
        entries = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
        base = roots[0].rstrip("/") + "/"
        for e in entries:
            e["rel"] = e["path"][len(base):] if e["path"].startswith(base) else e["path"]
        self.reads.append(ReadRecord(box.name, cmd, quiet, busy, before, after, entries, writes, rc, tail))
        self.faults[f"read_{cmd}"] += 1
        self.log(f"`{cmd}` on {box.name} ({'no run going' if quiet else 'during a run'}): exit {rc}"
                 + (f": {tail}" if rc else ""))

    def check_current(self) -> None:
        """With every run ended: once the newest input's version has a commit, ``current.json``
        names it (it moves only forward: a late or slow writer of an older input never wins).
        Judged before the final run, whose own start would move it anyway."""
        latest = self.generations[-1].version
        if latest is None or not self.view.commits(latest):
            return
        now = self.view.current()
        if now != latest:
            self.problems.append(Break("current", f"with every run ended, current.json names {now}, not {latest} "
                                                  "(the newest input's, which has commits)"))

    def damage(self, kind: str, box: Box) -> None:
        """Truncate one home file of ``kind`` (``harness_plan.DAMAGE``): in a folder home the home's,
        in a bucket home the final box's cache copy, or the bucket's pointer. The final run must
        heal it (or the checker finds what it cost)."""
        root = box.cache if self.plan.home == "s3" else self.work / "home"
        if kind == "current" and self.plan.home == "s3":
            fs, rel = self.view.fs, f"{self.view.root}/current.json"
            if fs.exists(rel):
                fs.pipe_file(rel, fs.cat_file(rel)[:9])
                self.faults["damage"] += 1
                self.log("damage: the bucket's current.json truncated to 9 bytes")
            return
        # The newest input's files: an older version's are read by no one (the final run heals
        # what readers see; the checker reads every version's commits).
        version = self.generations[-1].version or "none"
        pattern = {"shard": "shards/shard-*.parquet", "current": "current.json", "metrics": "metrics.duckdb",
                   "labeled": f"out/{version}/labeled/shard-*.parquet", "stats": f"out/{version}/stats/shard-*.json",
                   "manifest": "shards/manifest.json"}[kind]
        found = sorted(root.glob(pattern))
        if not found:
            self.log(f"damage: no {kind} file in {root} to truncate")
            return
        path = found[0]
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        self.faults["damage"] += 1
        self.log(f"damage: {path.relative_to(root)} truncated to {len(data) // 2} of {len(data)} bytes")

    def drain(self) -> None:
        """Wait until no proxy holds a request (a delayed PUT of a killed box lands, or not, first)."""
        deadline = time.monotonic() + 30
        for box in self.boxes.values():
            while box.proxy is not None and time.monotonic() < deadline:
                c = box.proxy.counts
                if c["requests"] <= c["forwarded"] + c["errors"] + c["drops"]:
                    break
                time.sleep(0.05)
