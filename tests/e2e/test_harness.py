"""The seeded fault harness (tests/support/harness.py) in ``make test``: two fixed seeds and the two
regression seeds that complete their fault kinds, both homes and every fault kind among them
(``make soak``: every other seed that ever found a break, and the reviewers' seeds); and the checker
(tests/support/checker.py) shown to catch each break on made-up homes, so a passing seed means
something.

A failing seed prints its schedule, what happened, the breaks and the one command that replays
it: ``python tests/support/harness.py --seed N --home s3|folder``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from checker import (
    BucketView,
    EpisodeRecord,
    FolderView,
    Generation,
    Mat,
    ProcRecord,
    ReadRecord,
    check_billed,
    check_cost,
    check_materialized,
    check_reads,
    check_rows,
)
from harness import run_seed
from harness_plan import FAULT_KINDS, make_plan

ROOT = Path(__file__).resolve().parents[2]

# make test runs this module on one xdist worker, in order (``--dist loadfile``): the check after
# the seeds reads what they injected.

#: One seed per home, chosen for the fault kinds they inject between them
#: (``python tests/support/harness.py --seed N --plan`` prints a seed's schedule).
FIXED = {
    2342: "S3; a box stopped at its bucket commit past its lease while another takes its shards over; SIGSTOP "
          "of the taker past its lease; SIGKILL",
    2370: "folder; a failpoint kill; two re-shards, one under a run held at its gate; preview, read_outputs",
}
#: Every seed a long harness run (benchmarks/fault_harness.py) has found failing, kept for good once its
#: break was fixed: what it found, and the result file that recorded it. `make test` runs those of
#: :data:`GATE_REGRESSION`, `make soak` every one (a seed takes 35 s of a quiet 2-core box, two minutes
#: beside the rest of the suite: all of them were a third of the suite's time).
REGRESSION = {
    19: "S3; claims left behind at the end (fault-harness-cpu-0-39.json)",
    25: "folder; a late commit on an old input moved current.json back; another version's exactly-once check "
        "blocked analytics (fault-harness-cpu-0-39.json)",
    11755: "S3; a run SIGKILLed after a re-shard left its old version's claims behind (fault-harness-h200-10000.json)",
    12005: "S3; a takeover crashed on a claim deleted under it; claims left behind (fault-harness-h200-10000.json)",
    20752: "folder; a shard committed by a killed run, never materialized: the checker's excuse for a kill "
           "between commit and event (fault-harness-h200-20000.json)",
    21760: "folder; the same, under a failpoint stop past the lease (fault-harness-h200-20000.json)",
    22750: "S3; an old input's run SIGSTOPped, resumed: moved the bucket's current.json back "
           "(fault-harness-h200-20000.json)",
    30003: "S3; our fault proxy forwarded a PUT torn mid-body and moto stored it (fault-harness-h200-30000.json)",
    30926: "S3; the torn PUT again (fault-harness-h200-30000.json)",
    32079: "S3; the torn PUT under a SIGSTOP past the lease (fault-harness-h200-30000.json)",
    32081: "S3; the torn PUT on a failpoint kill after commit: current.json lost (fault-harness-h200-30000.json)",
    32311: "S3; the torn PUT left a lease behind (fault-harness-h200-30000.json)",
    32314: "S3; the torn PUT left a box lease and claims behind (fault-harness-h200-30000.json)",
    32543: "S3; the torn PUT on an engine failure after a shard's last answer (fault-harness-h200-30000.json)",
    343: "S3; a box killed right after its bucket commit left the shard's claim and parts behind (found by the "
         "harness, stop 33)",
    70153: "folder; a damaged stats file: the shard set aside and committed again, which the checker counted as "
           "computed twice (fault-harness-h100-70000.json)",
    70232: "folder; the same for a damaged labeled file, after a failpoint kill (fault-harness-h100-70000.json)",
    70237: "folder; the same for a damaged stats file, after a failpoint stop (fault-harness-h100-70000.json)",
    70269: "folder; the same for a damaged labeled file (fault-harness-h100-70000.json)",
    70354: "folder; the same for a damaged stats file (fault-harness-h100-70000.json)",
}
#: `make soak` (with the long harness): the seeds chosen to reproduce breaks a review reported (not found
#: by the harness), and the episodes they reach.
SOAK = {
    799: "S3; a header-only input plus hostile ids (empty shards, colliding ids); store faults; clock skew",
    316: "S3; the engine dies right after a shard's last answer (a commit made as the run fails); status",
    337: "S3; a run held at its gate while another box re-shards and `sql` refreshes the run's own cache",
}
#: The regression seeds in `make test`: with :data:`FIXED` they inject every fault kind, counted as the
#: runs reached them (a fault whose trigger a run never reaches injects nothing, and some triggers race
#: the run: 2342's SIGKILL after C's 17th answer came in one run of two on 2026-12-07, 22750's slow
#: store in none). 32543: an engine failure, a status read; 32314: a cascade, empty shards, an sql read;
#: 12005: a SIGKILL after a gate (no race), a slow store, a status read.
GATE_REGRESSION = (32543, 32314, 12005)
#: What `make test` runs; the rest is marked long (`make soak`).
FIXED_SEEDS = list(FIXED) + list(GATE_REGRESSION)
SEEDS = FIXED_SEEDS + [pytest.param(s, marks=pytest.mark.long) for s in [*REGRESSION, *SOAK] if s not in FIXED_SEEDS]
#: What the seeds really injected (a trigger a run never reaches injects nothing).
INJECTED: dict[int, Counter[str]] = {}


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_keeps_every_invariant(seed, request, tmp_path):
    plan = make_plan(seed)
    server = request.getfixturevalue("s3_server") if plan.home == "s3" else None
    verdict = run_seed(seed, server=server, work=tmp_path)
    INJECTED[seed] = verdict.faults
    assert verdict.ok, verdict.report()


def test_the_fixed_seeds_injected_every_fault_kind():
    if not set(FIXED_SEEDS) <= set(INJECTED):
        pytest.skip("runs after every fixed and regression seed (run the whole module)")
    injected = {kind for seed in FIXED_SEEDS for kind, n in INJECTED[seed].items() if n}
    assert set(FAULT_KINDS) <= injected, sorted(set(FAULT_KINDS) - injected)


def test_the_fixed_seeds_cover_every_fault_kind_and_both_homes():
    plans = [make_plan(s) for s in FIXED_SEEDS]
    assert {p.home for p in plans} == {"s3", "folder"}
    covered = set().union(*(p.kinds() for p in plans))
    assert covered == set(FAULT_KINDS), sorted(set(FAULT_KINDS) - covered)


def test_a_seed_is_one_schedule():
    for seed in range(40):
        assert make_plan(seed).describe() == make_plan(seed).describe()
        forced = make_plan(seed, "folder")
        assert forced.home == "folder" and forced.shards == make_plan(seed, "s3").shards


def test_every_failpoint_a_plan_draws_is_in_the_code():
    """A renamed failpoint would make its seeds silently inject nothing."""
    code = "".join(p.read_text() for p in (ROOT / "sparkbatch_dagster").rglob("*.py"))
    drawn = {s.failpoint.split("@")[0] for seed in range(300) for s in make_plan(seed).steps if s.failpoint}
    assert len(drawn) >= 4 and all(f'failpoint("{p}")' in code for p in drawn), drawn


# -- failpoints: name[@n][=kill|stop] ---------------------------------------------------------------

SCRIPT = """
from sparkbatch_dagster.home import failpoint
for n in range(3):
    failpoint('p')
    print(n, flush=True)
"""


def _failing(points: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARKBATCH_FAILPOINT": points}
    return subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("points", "printed"), [("p", ""), ("p@2", "0\n"), ("q,p@3=kill", "0\n1\n"),
                                                 ("q@1=stop", "0\n1\n2\n")])
def test_a_failpoint_kills_at_its_nth_hit(points, printed):
    out, _ = _failing(points).communicate(timeout=60)
    assert out == printed


def test_a_failpoint_can_stop_the_process_until_sigcont():
    import psutil

    proc = _failing("p@2=stop")
    deadline = time.monotonic() + 60
    while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert out == "0\n1\n2\n" and proc.returncode == 0


# -- the checker catches what it claims to --------------------------------------------------------

V0, V1 = "0" * 16, "1" * 16


def _prompt(text: str) -> str:
    from sparkbatch_dagster.run.result_store import prompt_key
    from sparkbatch_dagster.spec.prompts import render

    spec = _spec()
    p = render("", spec.user_template, {"text": text})
    return prompt_key(p.system, p.user, spec.sampling, spec.output)


def _spec():
    from sparkbatch_dagster import JobSpec, OutputSpec

    return JobSpec(name="things", input="x.csv", id_column="id", text_columns=["text"],
                   user_template="What is this? {{ text }}", output=OutputSpec(kind="label", labels=["a", "b"]))


def _folder(tmp_path: Path, versions: dict[str, list[tuple[str, str | None]]], cost: float = 0.5) -> FolderView:
    """A folder home: for each version, one committed shard holding these (row_id, text) rows."""
    for version, rows in versions.items():
        base = tmp_path / "home" / "out" / version
        (base / "labeled").mkdir(parents=True)
        (base / "stats").mkdir()
        table = pa.table({"row_id": [r for r, _ in rows], "prompt_key": [_prompt(t) if t else None for _, t in rows],
                          "error": [None if t else "null_text" for _, t in rows]})
        pq.write_table(table, base / "labeled" / "shard-00000.parquet")
        (base / "stats" / "shard-00000.json").write_text(json.dumps({"cost_usd": cost, "rows": len(rows)}))
    (tmp_path / "home" / "current.json").write_text(json.dumps({"version": list(versions)[-1]}))
    return FolderView(tmp_path / "home")


def _record(view, generations, procs=(), reads=(), home="folder"):
    return EpisodeRecord(home, view, _spec(), generations, list(procs), list(reads), {})


def test_the_checker_finds_rows_of_another_input_and_duplicates(tmp_path):
    g0 = Generation(0, [("r1", "apple"), ("r2", "car"), ("r3", "dog")], V0)
    g1 = Generation(1, [("r1", "apple"), ("r2", "car (edited)"), ("r4", "cat")], V1)
    good = _folder(tmp_path / "good", {V0: [("r1", "apple"), ("r2", "car")],
                                       V1: [("r1", "apple"), ("r2", "car (edited)"), ("r4", "cat")]})
    commits = {v: good.commits(v) for v in good.versions()}
    assert check_rows(_record(good, [g0, g1]), commits) == []
    # The old version's shard holds the new input's row r2 and r4 (a swapped shard file); the
    # current one misses r4 and holds r1 twice.
    bad = _folder(tmp_path / "bad", {V0: [("r1", "apple"), ("r2", "car (edited)"), ("r4", "cat")],
                                     V1: [("r1", "apple"), ("r1", "apple"), ("r2", "car (edited)")]})
    found = [b.message for b in check_rows(_record(bad, [g0, g1]), {v: bad.commits(v) for v in bad.versions()})]
    assert any("holds 2 row(s) of another input" in m for m in found), found
    assert any("committed more than once" in m and "r1" in m for m in found), found
    assert any("1 of 3 input rows missing" in m and "r4" in m for m in found), found


def test_the_checker_wants_each_committed_shard_computed_once_and_its_cost(tmp_path):
    view = _folder(tmp_path, {V0: [("r1", "apple")]}, cost=0.5)
    commits = {V0: view.commits(V0)}
    rec = _record(view, [Generation(0, [("r1", "apple")], V0)])
    once = [Mat("A", "shard-00000", V0, True, 0.5, "run1")]
    assert check_materialized(rec, commits, once) == ([], []) and check_cost(commits, once, []) == []
    twice = [*once, Mat("B", "shard-00000", V0, True, 0.7, "run2")]
    assert "2 times" in check_materialized(rec, commits, twice)[0][0].message
    assert "$1.200000 against $0.500000" in check_cost(commits, twice, [])[0].message
    reused = [Mat("B", "shard-00000", V0, False, 0.0, "run2")]
    assert "only as reused" in check_materialized(rec, commits, reused)[0][0].message
    # A process SIGKILLed between its commit and its event is excused, once per kill.
    killed = _record(view, rec.generations, [ProcRecord("A", 11, "", -9, 5, killed=True)])
    assert check_materialized(killed, commits, reused) == ([], [(V0, "shard-00000")])


def test_the_checker_bills_a_lost_shard_as_waste(tmp_path):
    class Bucket(BucketView):
        def __init__(self, attempts):
            self._attempts = attempts

        def attempts(self, version):
            return self._attempts

        def versions(self):
            return [V0]

    shard = {"stats": {"cost_usd": 0.5}, "attempt": "won", "rows": []}
    winner = {"attempt": "won", "pid": 1, "partitions_committed": 1, "committed_cost_usd": 0.5, "outcome": "succeeded"}
    loser = {"attempt": "lost", "pid": 2, "partitions_committed": 1, "committed_cost_usd": 0.4, "outcome": "succeeded"}
    rec = _record(Bucket([winner]), [], home="s3")
    assert check_billed(rec, {V0: {"shard-00000": shard}}) == []
    rec = _record(Bucket([winner, loser]), [], home="s3")
    [found] = check_billed(rec, {V0: {"shard-00000": shard}})
    assert "attempt lost" in found.message and "not billed as waste" in found.message


def test_the_checker_catches_a_reader_that_swaps_shards_under_a_run():
    entry = {"op": "replace", "rel": "shards/shard-00001.parquet", "existed": True, "exclusive": []}
    read = ReadRecord("A", "status", False, True, None, None, [entry], [], 0)
    [found] = check_reads(_record(None, [], reads=[read], home="s3"))
    assert "without the shards lock" in found.message
    locked = {**entry, "exclusive": ["/c/.shards.lock"]}
    assert check_reads(_record(None, [], reads=[ReadRecord("A", "status", False, True, None, None, [locked], [],
                                                           0)], home="s3")) == []
    writes = [("PUT", "/b/jobs/things/out/0123456789abcdef/labeled/shard-00000.x.parquet")]
    [found] = check_reads(_record(None, [], reads=[ReadRecord("A", "sql", False, False, None, None, [], writes, 0)],
                                  home="s3"))
    assert "wrote to the bucket" in found.message


def test_a_reader_may_mark_a_dead_attempt_killed_and_nothing_else():
    running = json.dumps({"attempt": "x", "outcome": "running", "ended": None, "rows_committed": 3})
    killed = json.dumps({"attempt": "x", "outcome": "killed", "ended": "t", "rows_committed": 3})
    name = f"out/{V0}/attempts/x.json#text"
    ok = ReadRecord("A", "sql", True, False, {name: running}, {name: killed}, [], [], 0)
    assert check_reads(_record(None, [], reads=[ok])) == []
    more = json.dumps({"attempt": "x", "outcome": "killed", "ended": "t", "rows_committed": 4})
    changed = ReadRecord("A", "sql", True, False, {name: running, "current.json": "1"},
                         {name: more, "current.json": "2"}, [], [], 0)
    [found] = check_reads(_record(None, [], reads=[changed]))
    assert "current.json" in found.message and name in found.message
