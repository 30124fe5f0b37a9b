"""The fault harness's checker: issue 29's invariants, read after an episode from the home (the
bucket, or the shared folder) and from every box's Dagster instance.

    rows          every input row of the current version exactly once in the committed output (read
                  from what the commits name, compared with the ORIGINAL input file: a swapped shard
                  file cannot hide a break), and no row of another input in a version's folder
    materialized  every committed shard materialized, ``computed_in_this_run`` true exactly once
                  across all instances (a shard whose committing process was SIGKILLed between its
                  commit and its event may have none: a kill cannot be told to finish)
    cost          the this-run materializations' costs add up to the committed cost
    billed        an attempt record for every run that answered a prompt; no attempt counts a shard
                  the commits do not name it for (a box that lost its lease is billed as waste)
    leftovers     no claim, part or lock left in the home at the end
    read_only     a read-only command changed nothing: the home's digest before and after it, when no
                  run was going; and whenever it ran, nothing it wrote itself (its own file writes,
                  seen by an audit hook in its process, and its own requests to the bucket)
    finished      the final clean run succeeded (the job can finish)

What a reader may write (decided here, stated once): its Dagster instance (not the home); in a
folder home lock files and an attempt record moved from ``running`` to ``killed`` (its process is
dead: the bill says so from then on), in the bucket that same record (not ``metrics.duckdb``: the
writers keep it, ``sql`` reads an in-memory copy); in a bucket home's cache anything but a shard file replaced
while a run of that cache was going without the shards lock held exclusively. ``preview`` shards
a changed input as ``run`` does (``shards/``, under the exclusive shards lock, and the bucket's
``shards/`` plus its write probe; in a folder home its own scratch folders, ``.shards-tmp-<pid>``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checker_home import (  # noqa: F401 - the records and views, named here for the harness and tests
    Break,
    BucketView,
    EpisodeRecord,
    FolderView,
    Generation,
    ProcRecord,
    ReadRecord,
    is_attempt,
)

INVARIANTS = ("finished", "rows", "materialized", "cost", "billed", "leftovers", "read_only")
EPS = 1e-5


# -- the invariants ------------------------------------------------------------------------------


def check(rec: EpisodeRecord) -> tuple[list[Break], list[str]]:
    """Every invariant over one episode: (breaks, notes)."""
    breaks, notes = list(rec.problems), []
    commits = {v: rec.view.commits(v) for v in rec.view.versions()}
    commits = {v: c for v, c in commits.items() if c}
    breaks += check_rows(rec, commits)
    mats = materializations(rec.dagster_homes)
    # Shards whose committed files the harness damaged, found broken and committed again: each
    # commit was materialized and billed, and only the last one's stats are left to compare with.
    redone = frozenset((v, k) for v in commits for k in rec.view.recomputed(v))
    notes += [f"{v}/{k}: its damaged files were set aside and the shard committed again" for v, k in sorted(redone)]
    b, orphans = check_materialized(rec, commits, mats, redone)
    breaks += b
    notes += [f"{v}/{k} committed by a killed process, never materialized as computed" for v, k in orphans]
    breaks += check_cost(commits, mats, orphans, redone)
    breaks += check_billed(rec, commits, len(redone))
    killed = {p.pid for p in rec.procs if p.killed}
    left, litter = rec.view.leftovers(killed, rec.view.current())
    breaks += [Break("leftovers", f"{x} left at the end") for x in left]
    notes += [f"left at the end (not a claim): {x}" for x in litter]
    breaks += check_reads(rec)
    return breaks, notes


def expected_rows(gen: Generation, spec: Any) -> tuple[dict[str, str | None], int]:
    """The input's rows as the output must hold them: each row with an id of its own maps to its
    prompt key (None for an error row); rows with a duplicated or null id are only counted (the
    ids sharding gives them are its own business, so long as they are unique)."""
    from sparkbatch_dagster.run.result_store import prompt_key
    from sparkbatch_dagster.spec.prompts import check_text, render

    counts = Counter(rid for rid, _ in gen.rows)
    plain, others = {}, 0
    for rid, text in gen.rows:
        if rid is None or counts[rid] > 1:
            others += 1
            continue
        if check_text(text, "text", spec.max_input_chars):
            plain[rid] = None
        else:
            p = render(spec.system_prompt, spec.user_template, {"text": text})
            plain[rid] = prompt_key(p.system, p.user, spec.sampling, spec.output)
    return plain, others


def check_rows(rec: EpisodeRecord, commits: dict[str, dict[str, dict[str, Any]]]) -> list[Break]:
    out: list[Break] = []
    expected = [(g, *expected_rows(g, rec.spec)) for g in rec.generations]
    latest = rec.generations[-1]
    if latest.version is not None and rec.view.current() != latest.version:
        out.append(Break("rows", f"current.json names version {rec.view.current()}, not {latest.version} (the "
                                 f"latest input's)"))
    for version in sorted(set(commits) | ({latest.version} if latest.version else set())):
        mine = [e for e in expected if e[0].version == version]
        if not mine:
            out.append(Break("rows", f"version {version} has commits but is the version of no input written"))
            continue
        gen, plain, others = mine[-1]
        for key, c in sorted(commits.get(version, {}).items()):
            if c.get("record"):  # a committed file replaced since: readers would not count it done
                out.append(Break("rows", f"version {version}: {key}'s labeled file is not what its commit "
                                         f"recorded: {c['record']}"))
        rows = [r for c in commits.get(version, {}).values() for r in c["rows"]]
        twice = [rid for rid, n in Counter(r[0] for r in rows).items() if n > 1]
        if twice:
            out.append(Break("rows", f"version {version} (input v{gen.index}): {len(twice)} row id(s) committed more "
                                     f"than once, e.g. {twice[:3]}"))
        foreign, wrong, extra = [], [], 0
        for rid, key, _ in rows:
            if rid in plain:
                if key != plain[rid]:
                    other = [g.index for g, p, _ in expected if g is not gen and p.get(rid, "-") == key]
                    (foreign if other else wrong).append(f"{rid}" + (f" (as in input v{other[0]})" if other else ""))
            elif any(rid in p for g, p, _ in expected if g is not gen):
                foreign.append(rid)
            else:
                extra += 1
        if foreign:
            out.append(Break("rows", f"version {version} (input v{gen.index}) holds {len(foreign)} row(s) of another "
                                     f"input, e.g. {foreign[:3]}"))
        if wrong:
            out.append(Break("rows", f"version {version} (input v{gen.index}): {len(wrong)} row(s) with another "
                                     f"row's prompt, e.g. {wrong[:3]}"))
        if extra > others:
            out.append(Break("rows", f"version {version} (input v{gen.index}): {extra} rows with ids of no input row "
                                     f"(the input has {others} rows with a duplicated or null id)"))
        if gen is latest:
            missing = sorted(set(plain) - {r[0] for r in rows})
            if missing:
                out.append(Break("rows", f"current version {version}: {len(missing)} of {len(gen.rows)} input rows "
                                         f"missing from the committed output, e.g. {missing[:3]}"))
            if extra < others:
                out.append(Break("rows", f"current version {version}: {others - extra} of the {others} input rows with "
                                         "a duplicated or null id missing from the committed output"))
    return out


@dataclass
class Mat:
    box: str
    partition: str
    version: str
    this_run: bool
    cost: float
    run_id: str


def materializations(dagster_homes: dict[str, str]) -> list[Mat]:
    """Every ``labeled_outputs`` materialization in every box's instance."""
    from dagster import AssetKey, DagsterInstance

    key = AssetKey(["things", "labeled_outputs"])
    out = []
    for box, path in sorted(dagster_homes.items()):
        if not Path(path).exists():
            continue
        with DagsterInstance.from_config(path) as inst:
            for r in inst.fetch_materializations(key, limit=10_000).records:
                m = r.asset_materialization
                md = {k: getattr(v, "value", v) for k, v in m.metadata.items()}
                out.append(Mat(box, str(m.partition), str(md.get("version")), bool(md.get("computed_in_this_run")),
                               float(md.get("cost_usd") or 0.0), r.run_id))
    return out


def _committer_pids(rec: EpisodeRecord, version: str) -> dict[str, int]:
    return {str(a["attempt"]): int(a.get("pid") or 0) for a in rec.view.attempts(version)}


def check_materialized(rec: EpisodeRecord, commits: dict[str, dict[str, dict[str, Any]]], mats: list[Mat],
                       redone: frozenset[tuple[str, str]] = frozenset()) -> tuple[list[Break], list[tuple[str, str]]]:
    """Breaks, and the shards excused: committed by a process SIGKILLed before its event. With a
    bucket home the commit names its attempt; in a folder each kill can leave at most one (the
    event follows its commit in the same thread), so no more than the kills are excused."""
    out, orphans = [], []
    killed = {p.pid for p in rec.procs if p.killed}
    budget = len([p for p in rec.procs if p.killed])
    for version, shards in sorted(commits.items()):
        pids = _committer_pids(rec, version)
        for key, c in sorted(shards.items()):
            ours = [m for m in mats if m.version == version and m.partition == key]
            computed = [m for m in ours if m.this_run]
            if len(computed) > 1 + ((version, key) in redone):
                out.append(Break("materialized", f"{version}/{key}: computed_in_this_run=True {len(computed)} times "
                                                 f"(boxes {sorted(m.box for m in computed)}), once expected"))
            elif not computed:
                # The commit (or, in a folder, its stats) names its attempt: excused only if that
                # attempt's process was killed; with no attempt named, one shard per kill.
                excused = pids.get(str(c["attempt"])) in killed if c["attempt"] else budget > 0
                if excused:
                    budget -= 1
                    orphans.append((version, key))
                else:
                    out.append(Break("materialized", f"{version}/{key} is committed but "
                                                     + ("never materialized" if not ours else
                                                        "materialized only as reused (computed_in_this_run=False)")))
        strays = {(m.partition, m.box) for m in mats
                  if m.version == version and m.this_run and m.partition not in shards}
        out += [Break("materialized", f"{version}/{p} materialized as computed on {b} but never committed")
                for p, b in sorted(strays)]
    return out, orphans


def check_cost(commits: dict[str, dict[str, dict[str, Any]]], mats: list[Mat],
               orphans: list[tuple[str, str]], redone: frozenset[tuple[str, str]] = frozenset()) -> list[Break]:
    """``redone``: shards committed again after damage; their first commit's stats are gone, so
    neither side counts them."""
    out = []
    for version, shards in sorted(commits.items()):
        again = {k for v, k in redone if v == version}
        committed = sum(c["stats"]["cost_usd"] for k, c in shards.items()
                        if (version, k) not in orphans and k not in again)
        materialized = sum(m.cost for m in mats if m.version == version and m.this_run and m.partition not in again)
        if abs(committed - materialized) > EPS * (len(shards) + 1):
            out.append(Break("cost", f"version {version}: this-run materializations sum ${materialized:.6f} against "
                                     f"${committed:.6f} committed"))
    return out


def check_billed(rec: EpisodeRecord, commits: dict[str, dict[str, dict[str, Any]]], redone: int = 0) -> list[Break]:
    out = []
    records = {v: rec.view.attempts(v) for v in rec.view.versions()}
    for p in rec.procs:
        if p.answers and not any(a.get("pid") == p.pid and (rec.home != "s3" or p.cache in str(a.get("box")))
                                 for rs in records.values() for a in rs):
            out.append(Break("billed", f"box {p.box}'s run (pid {p.pid}) answered {p.answers} prompts but no attempt "
                                       "record of it is in the home"))
    killed = {p.pid for p in rec.procs if p.killed}
    for version, shards in sorted(commits.items()):
        attempts = records.get(version, [])
        if rec.home == "s3":
            out += _billed_by_commit(version, shards, attempts, killed)
            continue
        counted = sum(a.get("partitions_committed") or 0 for a in attempts)
        slack = len([a for a in attempts if a.get("pid") in killed])
        if counted > len(shards) + redone or counted < len(shards) - slack:
            out.append(Break("billed", f"version {version}: attempts count {counted} shards committed, the folder "
                                       f"holds {len(shards)}"))
    return out


def _billed_by_commit(version: str, shards: dict[str, dict[str, Any]], attempts: list[dict[str, Any]],
                      killed: set[int]) -> list[Break]:
    out = []
    by_attempt: dict[str, list[dict[str, Any]]] = {}
    for c in shards.values():
        by_attempt.setdefault(str(c["attempt"]), []).append(c)
    known = {str(a["attempt"]) for a in attempts}
    out += [Break("billed", f"version {version}: {len(cs)} commit(s) name attempt {a}, which has no record")
            for a, cs in sorted(by_attempt.items()) if a not in known]
    for a in attempts:
        mine = by_attempt.get(str(a["attempt"]), [])
        cost = sum(c["stats"]["cost_usd"] for c in mine)
        says, n = a.get("partitions_committed") or 0, len(mine)
        where = f"attempt {a['attempt']} (pid {a.get('pid')}, {a.get('outcome')})"
        if says > n or (a.get("committed_cost_usd") or 0.0) > cost + EPS * (n + 1):
            out.append(Break("billed", f"version {version}: {where} counts {says} shard(s) committed for "
                                       f"${a.get('committed_cost_usd')}, the commits name it for {n} (${cost:.6f}): "
                                       "work it lost is not billed as waste"))
        elif says < n and a.get("pid") not in killed and a.get("outcome") in ("succeeded", "failed"):
            out.append(Break("billed", f"version {version}: {where} counts {says} shard(s) committed, the commits name "
                                       f"it for {n}"))
    return out


def _allowed_change(rel: str, before: str | None, after: str | None, cmd: str) -> bool:
    if cmd == "preview" and rel.startswith("shards/"):
        return True
    if rel.endswith("#text"):  # an attempt record may be marked killed, and nothing else
        if not (before and after):
            return False
        a, b = json.loads(before), json.loads(after)
        keep = ("outcome", "ended", "error")
        return a.get("outcome") == "running" and b.get("outcome") == "killed" and \
            {k: v for k, v in a.items() if k not in keep} == {k: v for k, v in b.items() if k not in keep}
    return is_attempt(rel)  # an attempt record's tag: judged by its text, above


def check_reads(rec: EpisodeRecord) -> list[Break]:
    out = []
    for r in rec.reads:
        what = f"`{r.cmd}` on box {r.box}"
        if r.quiet and r.before is not None and r.after is not None:
            changed = sorted(n for n in set(r.before) | set(r.after) if r.before.get(n) != r.after.get(n)
                             and not _allowed_change(n, r.before.get(n), r.after.get(n), r.cmd))
            if changed:
                out.append(Break("read_only", f"{what}, no run going, changed the home: {changed[:4]}"))
        bad = [f"{m} {p}" for m, p in r.bucket_writes if not _bucket_write_ok(p, r.cmd)]
        if bad:
            out.append(Break("read_only", f"{what} wrote to the bucket: {bad[:4]}"))
        out += [Break("read_only", f"{what} {x}") for x in _audit_breaks(r, rec.home)]
    return out


def _bucket_write_ok(path: str, cmd: str) -> bool:
    rel = path.split("?")[0]
    if re.search(r"/out/[0-9a-f]{16}/attempts/[^/]+\.json$", rel):
        return True
    return cmd == "preview" and ("/shards/" in rel or ".sparkbatch-probe-" in rel)


def _audit_breaks(r: ReadRecord, home: str) -> list[str]:
    swapped, wrote = [], []
    for e in r.audit:
        rel, locked = e["rel"], e.get("exclusive", [])
        shards_locked = any(p.endswith("/.shards.lock") for p in locked)
        if home == "s3":
            if r.box_busy and rel.startswith("shards/") and e["op"] == "replace" and e.get("existed") \
                    and not shards_locked:
                swapped.append(rel)
            continue
        ok = rel.endswith(".lock") or re.fullmatch(r"out/[0-9a-f]{16}/attempts/\.?[^/]+\.json(\.tmp-\d+)?", rel) \
            or (r.cmd == "preview" and (
                (rel.startswith("shards/") and shards_locked) or re.match(r"\.[a-z]+-tmp-\d+(/|$)", rel)))
        if not ok:
            wrote.append(f"{rel} ({e['op']})")
    out = [f"replaced {len(swapped)} shard file(s) in the cache of a running job, without the shards lock: "
           f"{swapped[:4]}"] if swapped else []
    return out + ([f"wrote {len(wrote)} file(s) in the home: {wrote[:4]}"] if wrote else [])
