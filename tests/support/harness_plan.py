"""The fault harness's schedules: one seed gives one episode's plan, printed as numbered lines a
newcomer can follow (tests/support/harness.py runs it, tests/support/checker.py judges what it left).

An episode: a few "boxes" (separate processes of the real CLI, each with its own Dagster
instance; with an S3 home each has its own cache and its own fault proxy) label one job while
the plan injects faults. Triggers are tied to progress, not the clock: "when A has answered 23
prompts" counts lines of box A's fake-engine trace, "when A stops itself" waits for a failpoint
(``SPARKBATCH_FAILPOINT=bucket:commit@1=stop``), so a seed replays the same schedule. The one
wait that must be measured in time, a pause past the lease, is measured in leases.

    plan = make_plan(7)
    print("\\n".join(plan.describe()))
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOMES = ("s3", "folder")
READS = ("status", "sql", "preview", "read_outputs")
#: Every kind of fault a plan can inject; the fixed seeds of ``make test`` cover them all.
FAULT_KINDS = ("sigkill", "sigstop", "store_5xx", "store_lost_reply", "store_delay", "store_slow", "reshard",
               "read_status", "read_sql", "read_preview", "read_read_outputs", "empty_shards", "hostile_ids",
               "clock_skew", "engine_fail", "failpoint_kill", "failpoint_stop", "cascade", "damage")
#: Home files a plan may damage (truncate) once every run has ended, before the final run heals them.
DAMAGE = ("shard", "current", "metrics", "labeled", "stats", "manifest")
#: Rows whose ids collide with the ids sharding generates for duplicates and nulls, and a null text.
HOSTILE = [("a", "A hostile twin, the first."), ("a", "A hostile twin, the second."),
           ("a#dup2", "A real id that looks like a generated one."), (None, "A row with no id at all."),
           ("null-id-1", "A real id that looks like a null's."), ("e-empty", None)]
WORDS = ["apple", "banana", "cherry", "car", "truck", "bicycle", "dog", "cat", "horse"]


@dataclass
class BoxPlan:
    name: str
    skew_s: float = 0.0  # SPARKBATCH_CLOCK_SKEW_S: added to this box's lease clock
    faults: dict[str, Any] | None = None  # FaultProxy.set() arguments for its S3 requests

    def describe(self) -> str:
        skew = f"clock {self.skew_s:+.2f} s" if self.skew_s else "clock exact"
        if not self.faults:
            return f"box {self.name}: {skew}, no store faults"
        f = self.faults
        text = f"box {self.name}: {skew}, store faults:"
        if f.get("error_rate") is not None:
            text += (f" {f['error_rate']:.0%} 5xx, {f['drop_rate']:.0%} dropped before the store, "
                     f"{f['drop_after_upstream_rate']:.0%} replies lost after the write landed, {f['delay_rate']:.0%} "
                     f"delayed {f['delay_s']:.2f} s")
        if f.get("slow_rate"):
            text += (f" a slow store: {f['slow_rate']:.0%} of PUTs to {f['slow_path'] or 'anything'} held "
                     f"{f['slow_s']:.2f} s (at most {f['max_slow']})")
        return text


@dataclass
class Step:
    """One step; ``after=(box, k)``: first wait until that box's run has answered k prompts."""

    kind: str  # start | kill | stop | hold | await_stop | reshard | read | open | faults | wait | wait_all
    box: str | None = None
    after: tuple[str, int] | None = None
    cmd: str | None = None  # read: one of READS
    fail_after: Any = None  # start: n answers, or ("shard", m): right after the m-th shard's last answer
    failpoint: str | None = None  # start: SPARKBATCH_FAILPOINT
    faults: dict[str, Any] | None = None  # faults: FaultProxy.set() arguments
    empty: bool = False  # reshard: the new input is a header-only CSV
    gate_after: int | None = None  # start: the engine holds after this many answers until `open`

    def describe(self) -> str:
        when = f"when {self.after[0]} has answered {self.after[1]} prompts: " if self.after else ""
        what = {
            "start": lambda: f"start a run on {self.box}" + (
                f" whose engine fails after {_fail_text(self.fail_after)}" if self.fail_after is not None else "")
            + (f" with SPARKBATCH_FAILPOINT={self.failpoint}" if self.failpoint else "")
            + (f" whose engine holds after {self.gate_after} answers until its gate opens"
               if self.gate_after is not None else ""),
            "kill": lambda: f"SIGKILL {self.box}'s run",
            "stop": lambda: f"SIGSTOP {self.box}'s run",
            "hold": lambda: f"keep {self.box} stopped past its lease (until another box commits a shard it held, "
                            f"at least 1.5 leases), then SIGCONT",
            "await_stop": lambda: f"wait until {self.box}'s run stops itself at its failpoint",
            "reshard": lambda: "write a new version of the input file" + (" (header only)" if self.empty else ""),
            "read": lambda: f"run `{self.cmd}` on {self.box}'s cache and instance (read-only)",
            "faults": lambda: f"store faults on {self.box}: {self.faults}",
            "open": lambda: f"open {self.box}'s gate: its engine goes on",
            "wait": lambda: f"wait for {self.box}'s run to end",
            "wait_all": lambda: "wait for every run to end",
        }[self.kind]()
        return when + what


def _fail_text(fail: Any) -> str:
    return f"the last answer of its first {fail[1]} shard(s)" if isinstance(fail, tuple) else f"{fail} answers"


@dataclass
class Plan:
    seed: int
    home: str
    lease_s: float
    shards: int
    delay_s: float
    rows: int  # rows of the first input (0: a header-only CSV)
    hostile: bool
    boxes: list[BoxPlan]
    steps: list[Step] = field(default_factory=list)
    final_box: str = "A"
    cascade: bool = False  # the job is a cascade of two fake models (spec/cascade.py)
    damage: str | None = None  # a home file (DAMAGE) truncated once every run has ended, before the final run

    def describe(self) -> list[str]:
        head = (f"episode seed={self.seed} home={self.home}: {len(self.boxes)} boxes, lease {self.lease_s:g} s, "
                f"{self.shards} shards, fake engine {self.delay_s * 1000:.0f} ms a prompt"
                + (", a cascade of two models" if self.cascade else ""))
        rows = f"input v0: {self.rows} rows" + (" plus hostile ids (a, a, a#dup2, <null>, null-id-1) and a null "
                                                "text" if self.hostile else "")
        lines = [head, f"  {rows}", *(f"  {b.describe()}" for b in self.boxes)]
        lines += [f"  {n}. {s.describe()}" for n, s in enumerate(self.steps, 1)]
        damage = f", {self.damage} file truncated" if self.damage else ""
        return [*lines, f"  final: every run ended, faults cleared{damage}, a clean run on {self.final_box}, then "
                        "the checker"]

    def kinds(self) -> set[str]:
        """The fault kinds this plan injects. On an input of a few rows the faults that wait for
        answers (a kill after k of them, an engine failing after a shard) are left out: a run
        that ends sooner skips them."""
        kinds = {"hostile_ids"} if self.hostile else set()
        kinds |= {"empty_shards"} if self.rows < self.shards else set()
        kinds |= {"clock_skew"} if any(b.skew_s for b in self.boxes) else set()
        kinds |= {"cascade"} if self.cascade and self.rows else set()
        kinds |= {"damage"} if self.damage else set()
        for f in [b.faults for b in self.boxes if b.faults] + [s.faults for s in self.steps if s.faults]:
            kinds |= {k for k, rate in (("store_5xx", f.get("error_rate")), ("store_delay", f.get("delay_rate")),
                                        ("store_lost_reply", f.get("drop_after_upstream_rate")),
                                        ("store_slow", f.get("slow_rate"))) if rate}
        few = self.rows < 20
        for s in self.steps:
            if few and (s.after is not None or s.fail_after is not None or s.gate_after is not None):
                kinds |= {"empty_shards"} if s.empty else set()
                continue
            kinds |= {"kill": {"sigkill"}, "stop": {"sigstop"}, "reshard": {"reshard"}}.get(s.kind, set())
            kinds |= {"empty_shards"} if s.empty else set()
            kinds |= {f"read_{s.cmd}"} if s.kind == "read" else set()
            kinds |= {"engine_fail"} if s.fail_after is not None else set()
            if s.failpoint:
                kinds.add("failpoint_stop" if s.failpoint.endswith("=stop") else "failpoint_kill")
        return kinds


class _Planner:
    """Draws acts and keeps track of which boxes have a run going, so every step makes sense.

    An *opener* is a fault given to a run that starts on fresh work (the episode's first run, or
    the first run after a re-shard): its engine fails right after a shard's last answer, it
    kills or stops itself at a failpoint, or its engine holds at a gate while other boxes re-shard
    and read. The other acts hit runs already going."""

    def __init__(self, rng: random.Random, plan: Plan) -> None:
        self.rng, self.plan = rng, plan
        self.live: set[str] = set()
        self.killed: set[str] = set()
        self.floor: dict[str, int] = {}  # answers of a box's current run already waited for
        self.cap: dict[str, int] = {}  # answers its engine gives before it fails

    def k(self, box: str) -> int:
        """A progress trigger on the box's current run, after the ones before it and before its
        engine fails (a run that ends sooner skips the action)."""
        lo = self.floor.get(box, 0) + 1
        hi = min(int(max(self.plan.rows, 10) * 0.6), self.cap.get(box, 1 << 30) - 1)
        k = self.rng.randint(lo, max(lo, hi))
        self.floor[box] = k
        return k

    def add(self, step: Step) -> None:
        if step.kind == "start" and step.box in self.live:
            self.plan.steps.append(Step("wait", step.box))
        self.plan.steps.append(step)
        if step.kind == "start":
            box = str(step.box)
            self.live.add(box)
            self.killed.discard(box)
            self.floor[box] = step.gate_after or 0
            fail = step.fail_after
            self.cap[box] = fail if isinstance(fail, int) else (
                fail[1] * self.plan.rows // self.plan.shards if fail else 1 << 30)
        elif step.kind in ("kill", "wait"):
            self.live.discard(str(step.box))
            self.killed |= {str(step.box)} if step.kind == "kill" else set()
        elif step.kind == "wait_all":
            self.live.clear()

    def running(self) -> str:
        """A box with a run going (one is started when none is)."""
        if not self.live:
            self.add(Step("start", self.rng.choice(self.names())))
        return self.rng.choice(sorted(self.live))

    def other(self, box: str) -> str:
        return self.rng.choice([n for n in self.names() if n != box])

    def idle(self) -> str:
        free = [n for n in self.names() if n not in self.live]
        return self.rng.choice(free) if free else self.rng.choice(self.names())

    def names(self) -> list[str]:
        return [b.name for b in self.plan.boxes]

    # -- openers: a fault given to the run that starts on fresh work ------------------------------

    def open_run(self, box: str) -> None:
        opener = self.rng.choice(["none", "engine_fail", "failpoint_kill", "failpoint_stop", "gate"])
        start = Step("start", box)
        if opener == "engine_fail":
            start.fail_after = ("shard", self.rng.randint(1, max(1, self.plan.shards - 1))) \
                if self.rng.random() < 0.7 else self.rng.randint(1, max(2, self.plan.rows))
        elif opener == "failpoint_kill":
            points = ["finalize:stats", "finalize:committed"] + (
                ["bucket:commit", "bucket:committed"] if self.plan.home == "s3" else [])
            start.failpoint = f"{self.rng.choice(points)}@{self.rng.randint(1, 2)}=kill"
        elif opener == "failpoint_stop":
            point = "bucket:commit" if self.plan.home == "s3" and self.rng.random() < 0.7 else "finalize:committed"
            start.failpoint = f"{point}@{self.rng.randint(1, 2)}=stop"
        elif opener == "gate":
            start.gate_after = self.rng.randint(1, 5)
        self.add(start)
        if opener == "failpoint_kill":
            self.live.discard(box)
            self.killed.add(box)
        elif opener == "failpoint_stop":
            self.add(Step("await_stop", box))
            self.take_over(box)
        elif opener == "gate":
            # A changed input sharded by another box while this run labels the old one, then a
            # read on this run's own cache: its refresh must not swap the shard files under it.
            self.add(Step("reshard", after=(box, int(start.gate_after or 1)), empty=self.rng.random() < 0.15))
            self.add(Step("read", self.other(box), cmd="preview"))
            self.add(Step("read", box, cmd=self.rng.choice(["status", "sql", "read_outputs"])))
            self.add(Step("open", box))

    def take_over(self, box: str) -> None:
        """Another box runs while ``box`` is stopped, then ``box`` is held past its lease."""
        y = self.other(box)
        if y not in self.live:
            self.add(Step("start", y))
        self.add(Step("hold", box))

    # -- acts on runs going -----------------------------------------------------------------------

    def act_kill(self) -> None:
        x = self.running()
        self.add(Step("kill", x, after=(x, self.k(x))))
        if self.rng.random() < 0.5:
            self.add(Step("start", x))  # restarted at once; else at the end of the plan

    def act_pause(self) -> None:
        x = self.running()
        self.add(Step("stop", x, after=(x, self.k(x))))
        self.take_over(x)

    def act_reshard(self) -> None:
        self.add(Step("reshard", empty=self.rng.random() < 0.15))
        self.open_run(self.idle())

    def act_read(self) -> None:
        cmd = self.rng.choice(READS)
        if self.live and self.rng.random() < 0.6:
            x = self.running()
            self.add(Step("read", self.rng.choice(self.names()), cmd=cmd, after=(x, self.k(x))))
        else:
            self.add(Step("wait_all"))
            self.add(Step("read", self.rng.choice(self.names()), cmd=cmd))

    def act_burst(self) -> None:
        if self.plan.home != "s3":
            return self.act_read()
        x = self.running()
        burst = {"error_rate": 0.4, "drop_after_upstream_rate": 0.3, "delay_rate": 0.3, "delay_s": 0.5,
                 "max_faults": self.rng.randint(5, 25), "seed": self.rng.randrange(1 << 30)}
        self.add(Step("faults", x, after=(x, self.k(x)), faults=burst))
        return None


ACTS = ("kill", "pause", "reshard", "read", "burst")


def make_plan(seed: int, home: str | None = None) -> Plan:
    """The episode of ``seed`` (``home`` forces the home; the rest of the draws stay the same)."""
    rng = random.Random(seed)
    drawn_home = rng.choice(HOMES)
    lease = rng.choice([3.0, 4.0])
    shards = rng.randint(3, 7)
    rows = rng.randint(50, 110) if rng.random() >= 0.15 else rng.choice([0, 1, shards - 1])
    plan = Plan(seed=seed, home=home or drawn_home, lease_s=lease, shards=shards,
                delay_s=round(rng.uniform(0.03, 0.06), 3), rows=rows, hostile=rng.random() < 0.3, boxes=[])
    # Drawn apart from the schedule's stream, so every seed's schedule stays what it was.
    plan.cascade = random.Random(f"cascade-{seed}").random() < 0.35
    for name in "ABC"[: rng.choice([2, 2, 3])]:
        # Skew within the documented bound (docs/protocol.md: clocks may differ by a third of a
        # lease): at most an eighth of it either way, so two boxes differ by a quarter at most.
        skew = round(rng.uniform(-lease / 8, lease / 8), 2) if rng.random() < 0.5 else 0.0
        faults = None
        if rng.random() < 0.5:
            # Rare enough that a run still finishes in seconds: botocore backs off on every 5xx.
            faults = {"error_rate": round(rng.uniform(0.01, 0.05), 3), "drop_rate": round(rng.uniform(0.0, 0.02), 3),
                      "drop_after_upstream_rate": round(rng.uniform(0.01, 0.04), 3),
                      "delay_rate": round(rng.uniform(0.05, 0.15), 3), "delay_s": round(rng.uniform(0.05, 0.2), 2),
                      "seed": rng.randrange(1 << 30)}
        plan.boxes.append(BoxPlan(name, skew, faults if plan.home == "s3" else None))
    planner = _Planner(rng, plan)
    planner.open_run("A")
    for _ in range(rng.randint(0, 2)):
        getattr(planner, f"act_{rng.choice(ACTS)}")()
    for box in sorted(planner.killed):  # a killed box comes back before the end
        planner.add(Step("start", box))
    plan.final_box = rng.choice(planner.names())
    _draw_issue49(plan)
    return plan


def _draw_issue49(plan: Plan) -> None:
    """A slow store (PUTs held one to two leases) and a damaged home file, drawn from a stream of
    their own so that every seed's schedule stays what it was."""
    rng = random.Random(f"slow-store-{plan.seed}")
    if plan.home == "s3" and rng.random() < 0.4:
        # A box that runs (its first run, or the final one), and every PUT to the path held until
        # ``max_slow`` were: a slow store that is sure to be met.
        box = rng.choice([b for b in plan.boxes if b.name == "A" or b.name == plan.final_box
                          or any(s.kind == "start" and s.box == b.name for s in plan.steps)])
        slow = {"slow_rate": 1.0, "slow_s": round(rng.uniform(1, 2) * plan.lease_s, 2),
                "slow_path": rng.choice(["current.json", "/commits/", "/leases/", None]),
                "max_slow": rng.randint(1, 3)}
        box.faults = {**(box.faults or {"seed": rng.randrange(1 << 30)}), **slow}
    if rng.random() < 0.3:
        plan.damage = rng.choice(DAMAGE)


# -- inputs ----------------------------------------------------------------------------------------


def input_rows(plan: Plan, generation: int, before: list[tuple[str | None, str | None]] | None,
               empty: bool = False) -> list[tuple[str | None, str | None]]:
    """Rows (id, text) of the input's ``generation``: v0 from the plan; each next one changes
    some texts, drops some rows and adds new ones (ids stay, as in a real changed input)."""
    if empty:
        return []
    rng = random.Random(plan.seed * 7919 + generation)
    if generation == 0 or before is None:
        rows: list[tuple[str | None, str | None]] = [
            (f"r{i:04d}", f"Item {i}: a {WORDS[i % 9]} seen on day {i % 11} #{i}") for i in range(plan.rows)]
        if plan.hostile:
            for row in HOSTILE:
                rows.insert(rng.randint(0, len(rows)), row)
        return rows
    rows = []
    for rid, text in before:
        draw = rng.random()
        if draw < 0.1 and rid is not None and rid.startswith("r"):
            continue  # dropped from the new input
        rows.append((rid, f"{text} (edited in v{generation})" if draw < 0.3 and text else text))
    top = max([int(r[1:]) for r, _ in rows if r and r.startswith("r") and r[1:].isdigit()] or [plan.rows])
    rows += [(f"r{top + j + 1:04d}", f"New item {j} of v{generation}: a {WORDS[j % 9]}") for j in range(
        rng.randint(1, 8))]
    return rows


def write_input(path: Path, rows: list[tuple[str | None, str | None]]) -> None:
    """A CSV: a null is an empty unquoted field (DuckDB reads it as NULL)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["id", "text"])
        out.writerows([[rid or "", text or ""] for rid, text in rows])
    tmp.replace(path)  # a box sharding right now reads the old bytes or the new, never half


def read_input(path: Path) -> list[tuple[str | None, str | None]]:
    with path.open(newline="") as fh:
        return [(r["id"] or None, r["text"] or None) for r in csv.DictReader(fh)]
