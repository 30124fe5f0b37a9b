"""What people said of the rows: the human labels imported from an annotation tool (Label Studio,
``sparkbatch review import``), kept in the job's home under ``review/labels/``.

The store is append-only: each merge writes one Parquet file named by the digest of what it adds
(only the labels that are new or changed: nothing new, no file), so two boxes importing at once
never lose each other's writes and importing the same annotations again changes nothing. Reading
is the union of the files, the latest ``reviewed_at`` per row winning (ties broken by source, label
and reviewer, so every reader picks the same one); a label no longer in the job's label set is
skipped and counted. A file that does not parse or is not what its name is the digest of is
damaged: fetched again from a bucket home, else left out by readers; a writer's :func:`heal`
publishes a whole copy again or sets a lost one aside and says so (``docs/failures.md``).

Example::

    merge(home, [HumanLabel.of("pkg-1", "fruit", "ann@example.com", "2026-12-06T13:50:45Z",
                               "label-studio:things/12/40", labels)], labels)   # MergeResult(added=1, ...)
    load(home, labels)["pkg-1"].label                                          # 'fruit'
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path

from ..errors import SparkbatchError
from ..home import JobHome, atomic_write_parquet
from ..home.review_files import set_aside, set_aside_object, tell_once
from ..spec import fingerprint

log = logging.getLogger("sparkbatch")
#: The columns of every file, in this order, all strings.
COLUMNS = ("row_id", "label", "reviewer", "reviewed_at", "source", "labels_digest")


def labels_digest(labels: Iterable[str]) -> str:
    """A label set's digest, order-free: the one ``estimate/calibration.labels_digest`` gives."""
    return fingerprint(sorted(set(labels)))


def utc_iso(when: str | datetime) -> str:
    """``when`` as ISO-8601 in UTC with microseconds (``2026-12-06T13:50:45.821385+00:00``), the one
    spelling the store keeps, so that times compare as strings. A time without a zone is refused."""
    try:
        moment = when if isinstance(when, datetime) else datetime.fromisoformat(when)
    except (TypeError, ValueError):
        raise SparkbatchError(f"reviewed_at {when!r} is not an ISO-8601 time: give one with its zone, e.g. "
                              "2026-12-06T13:50:45Z") from None
    if moment.tzinfo is None:
        raise SparkbatchError(f"reviewed_at {when!r} has no time zone: give one, e.g. 2026-12-06T13:50:45Z (UTC)")
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class HumanLabel:
    """A reviewer's label of one row: who said it, when (ISO-8601, UTC), where (``source``, e.g.
    ``label-studio:<project>/<task>/<annotation>``) and under which label set (``labels_digest``)."""

    row_id: str
    label: str
    reviewer: str
    reviewed_at: str
    source: str
    labels_digest: str

    @classmethod
    def of(cls, row_id: str, label: str, reviewer: str, reviewed_at: str | datetime, source: str,
           labels: Sequence[str]) -> HumanLabel:
        """One label, its time normalized to UTC and its label set's digest computed."""
        return cls(row_id=str(row_id), label=label, reviewer=reviewer, reviewed_at=utc_iso(reviewed_at),
                   source=source, labels_digest=labels_digest(labels))

    def order(self) -> tuple[str, str, str, str]:
        """What decides between two labels of one row: the latest wins, ties broken deterministically."""
        return self.reviewed_at, self.source, self.label, self.reviewer


@dataclass(frozen=True)
class MergeResult:
    """What a merge did: rows that had no human label (``added``), rows whose label it replaced
    (``changed``), labels it already had or that an older review gave (``unchanged``), and the file
    it wrote (None: nothing new)."""

    added: int
    changed: int
    unchanged: int
    path: Path | None


class Loaded(dict[str, HumanLabel]):
    """:func:`load`'s answer: each row's label by row id, with ``skipped`` (labels no longer in the
    job's label set) and ``files`` (how many files were read)."""

    skipped: int = 0
    files: int = 0


def labels_folder(home: JobHome) -> Path:
    return home.review_dir / "labels"


def pull(home: JobHome) -> int:
    """With a bucket home, bring the label files other boxes published into the cache (files are
    named by their content: one already here is the same); returns how many came. A folder home: 0."""
    if home.remote is None:
        return 0
    folder = labels_folder(home)
    rel = home.remote.rel(folder)
    came = 0
    for name in sorted(home.remote.bucket.list(rel)):
        if name.endswith(".parquet") and "/" not in name and not (folder / name).exists():
            home.remote.bucket.get_file(f"{rel}/{name}", folder / name)
            came += 1
    return came


def _read(home: JobHome) -> tuple[list[HumanLabel], int]:
    """The labels of every file that is whole (:func:`verify`); a damaged one is fetched again from a
    bucket home, else left out, with one warning line (a writer sets it aside: :func:`heal`)."""
    found: list[HumanLabel] = []
    files = sorted(labels_folder(home).glob("*.parquet"))
    for path in files:
        got = verify(path)
        if isinstance(got, str) and _refetch(home, path):
            got = verify(path)
        if isinstance(got, str):
            tell_once(path, f"{path} is left out ({got}): its labels are not read until a good copy comes back "
                            "(`sparkbatch run` sets the file aside; `sparkbatch review import` adds what it held)")
            continue
        found += got
    return found, len(files)


def verify(path: Path, name: str | None = None) -> list[HumanLabel] | str:
    """The labels in ``path``, or why it is damaged: it does not parse, or its content is not the
    one its name (``name``, else the file's) is the digest of (every file is named by what it
    holds, :func:`_write`)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=list(COLUMNS))
        found = [HumanLabel(**r) for r in table.to_pylist()]
    except FileNotFoundError:
        return "gone"
    except Exception as exc:  # noqa: BLE001 - pyarrow's many ways of saying the bytes are not Parquet
        said = (str(exc).replace(f"'{path}'", "").replace(str(path), "").splitlines() or [type(exc).__name__])[0]
        return f"not a human-labels file: {said.strip()[:160]}"
    if not found or (name or path.name).removesuffix(".parquet") != _digest(found):
        return "its labels are not the ones its name is the digest of"
    return found


def _digest(found: list[HumanLabel]) -> str:
    return hashlib.sha256(json.dumps([asdict(h) for h in found], sort_keys=True).encode()).hexdigest()[:32]


def _refetch(home: JobHome, path: Path) -> bool:
    """With a bucket home, the bucket's copy of a damaged cache file, if it is whole (then it
    replaces the cache's); True if it did."""
    if home.remote is None:
        return False
    tmp = path.with_name(f".{path.name}.check")
    try:
        home.remote.bucket.get_file(home.remote.rel(path), tmp)
    except FileNotFoundError:
        return False
    if isinstance(verify(tmp, path.name), str):
        tmp.unlink(missing_ok=True)
        return False
    os.replace(tmp, path)
    log.warning("%s was damaged in this cache: fetched again from %s", path, home.location)
    return True


def heal(home: JobHome) -> list[str]:
    """A writer's repair of the store (``sparkbatch run``, an import, the review assets), after the
    cache was refreshed: a damaged cache file comes again from the bucket (:func:`_read`); a file whole
    here and damaged or absent in the bucket is published again (named by its content, the same file);
    a file with no good copy left is set aside here and in the bucket, kept, and its loss reported.
    Returns the names of the files lost (their labels stay in Label Studio: import again)."""
    folder = labels_folder(home)
    listing = home.remote.bucket.list(home.remote.rel(folder)) if home.remote is not None else {}
    lost: dict[str, str] = {}
    for path in sorted(folder.glob("*.parquet")):
        why = verify(path)
        if isinstance(why, str) and not _refetch(home, path):
            lost[path.name] = why
            continue
        if home.remote is not None and listing.get(path.name) != path.stat().st_size:
            log.warning("%s: the bucket's copy is %s: published again from this box's whole copy", path.name,
                        "missing" if path.name not in listing else "damaged")
            home.publish(path)
    then = ("the labels only it held are lost from the store: `sparkbatch review import` adds them again from "
            "Label Studio (a box whose cache holds a whole copy publishes it again at its next run)")
    for name, why in lost.items():
        if home.remote is not None and name in listing:
            set_aside_object(home.remote.bucket, f"{home.remote.rel(folder)}/{name}")
        set_aside(folder / name, f"{why}; no whole copy here{' or in the bucket' if home.remote else ''}", then)
    return sorted(lost)


def _latest(found: Iterable[HumanLabel]) -> dict[str, HumanLabel]:
    out: dict[str, HumanLabel] = {}
    for h in found:
        seen = out.get(h.row_id)
        if seen is None or h.order() > seen.order():
            out[h.row_id] = h
    return out


def load(home: JobHome, labels: Sequence[str]) -> Loaded:
    """Every row's latest human label whose label is one of ``labels`` (the job's label set; empty:
    any), by row id. Reads the cache only: :func:`pull` first to see a bucket's newest."""
    found, files = _read(home)
    allowed = set(labels)
    kept = [h for h in found if not allowed or h.label in allowed]
    out = Loaded(_latest(kept))
    out.files, out.skipped = files, len(found) - len(kept)
    if out.skipped:
        log.warning("%d human label(s) in %s are not among the job's labels %s now: skipped", out.skipped,
                    labels_folder(home), sorted(allowed))
    return out


def check(found: Sequence[HumanLabel], labels: Sequence[str]) -> None:
    """Refuse a label that is not one of the job's labels, naming the row, the label and the fix."""
    allowed = set(labels)
    if not allowed:
        raise SparkbatchError("human labels need a label job (output.kind='label' with output.labels): this "
                              "job's output has no label set")
    for h in found:
        if h.label not in allowed:
            raise SparkbatchError(f"row {h.row_id!r}: label {h.label!r} ({h.source}) is not one of the job's labels "
                                  f"{sorted(allowed)}: correct it in the annotation tool, or add it to output.labels")


def merge(home: JobHome, found: Sequence[HumanLabel], labels: Sequence[str]) -> MergeResult:
    """Add ``found`` to the store of the job whose label set is ``labels``: one new file of the labels
    that are new or newer than the row's stored one (published to a bucket home), none if nothing is.
    A label outside ``labels`` refuses the whole merge before anything is written."""
    check(found, labels)
    pull(home)
    heal(home)
    stored, _ = _read(home)
    known = set(stored)
    latest = _latest(stored)
    new: list[HumanLabel] = []
    added = changed = unchanged = 0
    for h in sorted(_latest(found).values(), key=lambda h: h.row_id):
        seen = latest.get(h.row_id)
        if h in known or (seen is not None and h.order() <= seen.order()):
            unchanged += 1
            continue
        added, changed = added + (seen is None), changed + (seen is not None)
        new.append(h)
    if not new:
        return MergeResult(added, changed, unchanged, None)
    path = _write(home, new)
    return MergeResult(added, changed, unchanged, path)


def _write(home: JobHome, new: list[HumanLabel]) -> Path:
    import pyarrow as pa

    path = labels_folder(home) / f"{_digest(new)}.parquet"
    names = [f.name for f in fields(HumanLabel)]
    table = pa.Table.from_pydict({n: [getattr(h, n) for h in new] for n in names},
                                 schema=pa.schema([(n, pa.string()) for n in names]))
    atomic_write_parquet(path, table, point="write:human_labels")
    home.publish(path)
    return path
