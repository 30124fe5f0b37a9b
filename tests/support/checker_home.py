"""What the fault harness's checker (tests/support/checker.py) reads: an episode's record (its inputs,
processes and read-only commands, written by tests/support/harness.py) and the home itself, a bucket or a
shared folder, read straight from the store."""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


@dataclass
class Break:
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}"


@dataclass
class Generation:
    index: int
    rows: list[tuple[str | None, str | None]]
    version: str | None  # the output version a run of this input makes (None: it could not be sharded)


@dataclass
class ProcRecord:
    box: str
    pid: int
    cache: str
    returncode: int | None
    answers: int
    killed: bool  # ended by SIGKILL (the harness's, or its own failpoint's)
    final: bool = False
    err_tail: str = ""


@dataclass
class ReadRecord:
    box: str
    cmd: str
    quiet: bool  # no run was going during it: the home's digest must not change
    box_busy: bool  # a run of the same cache (or folder) was going when it started
    before: dict[str, str] | None
    after: dict[str, str] | None
    audit: list[dict[str, Any]]
    bucket_writes: list[tuple[str, str]]
    returncode: int | None
    err_tail: str = ""


@dataclass
class EpisodeRecord:
    home: str
    view: Any  # BucketView | FolderView
    spec: Any  # the JobSpec (its templates render the expected prompts)
    generations: list[Generation]
    procs: list[ProcRecord]
    reads: list[ReadRecord]
    dagster_homes: dict[str, str]
    problems: list[Break] = field(default_factory=list)  # the runner's own (a hang, a failed final run)


# -- the home, read ------------------------------------------------------------------------------


class BucketView:
    """The job's objects in the bucket (``root``: bucket/prefix), read straight from the store."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")

    def names(self) -> dict[str, str]:
        """Every object: its name under the root and its ETag (S3's ETag of a PUT is its MD5)."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        return {k[len(self.root) + 1:]: str(v.get("ETag") or v.get("size")) for k, v in found.items()}

    def read(self, rel: str) -> bytes:
        # moto serves a read that races a PUT of the same key (a run rewriting its attempt record)
        # with an empty body and the new checksum: botocore refuses it; read it again.
        for n in range(5):
            try:
                return bytes(self.fs.cat_file(f"{self.root}/{rel}"))
            except FileNotFoundError:
                raise
            except Exception:
                if n == 4:
                    raise
                time.sleep(0.2 * (n + 1))
        raise AssertionError("unreachable")

    def digest(self) -> dict[str, str]:
        """Names and content tags, and the attempt records' text (a reader may mark one killed)."""
        names = self.names()
        return {**names, **{f"{n}#text": self.read(n).decode() for n in names if is_attempt(n)}}

    def versions(self) -> list[str]:
        return sorted({n.split("/")[1] for n in self.names() if n.startswith("out/")})

    def commits(self, version: str) -> dict[str, dict[str, Any]]:
        out = {}
        for n in sorted(self.names()):
            if n.startswith(f"out/{version}/commits/") and n.endswith(".json"):
                commit = json.loads(self.read(n))
                data = self.read(commit["labeled"])
                table = pq.read_table(io.BytesIO(data))
                out[n.rsplit("/", 1)[1][:-5]] = {"stats": commit["stats"], "attempt": commit.get("attempt"),
                                                 "rows": _rows(table), "record": not_as_recorded(data, commit["stats"])}
        return out

    def attempts(self, version: str) -> list[dict[str, Any]]:
        return [json.loads(self.read(n)) for n in sorted(self.names())
                if n.startswith(f"out/{version}/attempts/") and n.endswith(".json")]

    def current(self) -> str | None:
        return json.loads(self.read("current.json"))["version"] if "current.json" in self.names() else None

    def recomputed(self, version: str) -> set[str]:
        """Shards committed again after damage: none (a commit is created once; a damaged cache
        copy is fetched again)."""
        return set()

    def leftovers(self, killed_pids: set[int], current: str | None) -> tuple[list[str], list[str]]:
        """(breaks, notes): claims and parts left; a killed box's own lease or a fence is a note,
        and so are the parts of a version an input sharded again left unfinished (checkpoints
        a run of that input resumes from, should it come back)."""
        breaks, notes = [], []
        for n in sorted(self.names()):
            if "/parts/" in n:
                (notes if _superseded(n, current) else breaks).append(f"part {n}")
            elif n.startswith("leases/"):
                body = json.loads(self.read(n) or b"{}")
                pid = _pid(str(body.get("owner", "")))
                if n.startswith("leases/boxes/") and (body.get("fenced_by") or pid in killed_pids):
                    notes.append(f"{n} ({'fenced' if body.get('fenced_by') else 'its process was killed'})")
                else:
                    breaks.append(f"lease {n} (owner {body.get('owner')})")
            elif n.rsplit("/", 1)[-1].startswith(".sparkbatch-probe-"):
                notes.append(f"write probe {n} (its process died between writing and removing it)")
        return breaks, notes


class FolderView:
    """The job's shared folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file())

    def digest(self) -> dict[str, str]:
        """Every file's bytes (``metrics.duckdb`` too: no reader writes it), except lock files (a
        lock taken and released leaves its file, holding the pid)."""
        import hashlib

        out = {}
        for p in self.files():
            rel = p.relative_to(self.root).as_posix()
            if rel.endswith(".lock"):
                continue
            data = p.read_bytes()
            if is_attempt(rel):
                out[f"{rel}#text"] = data.decode()
            else:
                out[rel] = hashlib.sha1(data).hexdigest()  # noqa: S324 - a digest, not a secret
        return out

    def versions(self) -> list[str]:
        out = self.root / "out"
        return sorted(p.name for p in out.iterdir()) if out.exists() else []

    def commits(self, version: str) -> dict[str, dict[str, Any]]:
        base = self.root / "out" / version
        out = {}
        for p in sorted((base / "labeled").glob("shard-*.parquet")):
            stats = json.loads((base / "stats" / f"{p.stem}.json").read_text())
            data = p.read_bytes()
            out[p.stem] = {"stats": stats, "attempt": stats.get("attempt"),
                           "rows": _rows(pq.read_table(io.BytesIO(data))), "record": not_as_recorded(data, stats)}
        return out

    def attempts(self, version: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "out" / version / "attempts").glob("*.json"))]

    def recomputed(self, version: str) -> set[str]:
        """Shards whose committed files were found broken, set aside (``*.broken-<time>``) and committed again."""
        base = self.root / "out" / version
        return {p.name.split(".")[0] for d in ("labeled", "stats") for p in (base / d).glob("shard-*.broken-*")}

    def current(self) -> str | None:
        path = self.root / "current.json"
        return json.loads(path.read_text())["version"] if path.exists() else None

    def leftovers(self, killed_pids: set[int], current: str | None) -> tuple[list[str], list[str]]:
        import fcntl

        breaks, notes = [], []
        for p in self.files():
            rel = p.relative_to(self.root).as_posix()
            if "/parts/" in rel:
                (notes if _superseded(rel, current) else breaks).append(f"part {rel}")
            elif ".tmp-" in p.name or ".dl-" in p.name:
                notes.append(f"temporary file {rel} (its process died mid-write)")
            elif p.name.endswith(".lock"):
                with p.open("a") as fh:  # every process has ended: a lock still held is a leak
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        breaks.append(f"lock {rel} still held")
        return breaks, notes


def _superseded(rel: str, current: str | None) -> bool:
    """A path under ``out/<version>/`` of a version other than the current one."""
    return rel.startswith("out/") and current is not None and rel.split("/")[1] != current


def is_attempt(rel: str) -> bool:
    return "/attempts/" in rel and rel.endswith(".json")


def _pid(owner: str) -> int | None:
    parts = owner.split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def not_as_recorded(data: bytes, stats: dict[str, Any]) -> str | None:
    """Why a committed labeled file (its bytes) is not what its commit record says: its row count,
    and, in records that keep them, its size and sha256 (None: it is)."""
    import hashlib

    rows = pq.read_metadata(io.BytesIO(data)).num_rows
    if rows != stats.get("rows"):
        return f"{rows} rows, the commit recorded {stats.get('rows')}"
    if stats.get("labeled_bytes") not in (None, len(data)):
        return f"{len(data)} bytes, the commit recorded {stats['labeled_bytes']}"
    if stats.get("labeled_sha256") not in (None, hashlib.sha256(data).hexdigest()):
        return "its sha256 is not the one the commit recorded"
    return None


def _rows(table: Any) -> list[tuple[str, str | None, str | None]]:
    cols = table.select(["row_id", "prompt_key", "error"]).to_pydict()
    return list(zip(cols["row_id"], cols["prompt_key"], cols["error"], strict=True))
