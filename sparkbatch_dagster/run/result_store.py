"""The result store: every generated answer is stored once, under what determined it, and
any later run (another version, another shard layout, appended input) reuses it instead of
paying the engine again.

    <store>/<context>/seg-L<level>-<id>.parquet     k1, k2, output, error, prompt_tokens,
                                                    output_tokens, model, created_at, confidence,
                                                    reasoning

``context`` is :meth:`JobSpec.answer_context`: model identity + the job's sampling + output spec.
Within it an answer is keyed by 128 bits of sha256 of what the engine receives for it
(:func:`..spec.identity.answer_key`: messages, tools, effective sampling, output), as two BIGINT
columns: a lookup reads 16 bytes a stored row, and DuckDB joins a shard's keys
against them. Open it with anything that reads Parquet::

    duckdb -c "FROM '.sparkbatch/tickets/results/*/*.parquet' LIMIT 5"

Segments are written once (a temporary name, fsync, rename) and merged by level, 16 at a time,
so a store of 10M answers stays a few dozen files. Readers hold a shared lock on the context
folder while they read; a merge takes it exclusively only to swap files.

In an object store (``remote``: the home's ``results/`` or a ``result_store`` URL) the folder is
a cache. A segment is uploaded under its unique name before the shard that made it commits, and
a merge uploads the merged segment before it deletes its inputs, so a listing never misses an
answer; a segment is immutable and PUTs are all-or-nothing, so the listing is the store's
manifest, and a duplicate answer (two boxes merging the same inputs) is harmless: lookups take
any one copy of a key.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..home import Bucket, FileLock, JobHome, atomic_write_parquet
from ..spec import OutputSpec, SamplingSpec
from ..spec.prompts import RenderedPrompt
from .checkpoint import WITH_CONFIDENCE, WITH_EXTRA, WITH_REASONING, WITH_TRUNCATED

log = logging.getLogger("sparkbatch")

SCHEMA = pa.schema([
    ("k1", pa.int64()), ("k2", pa.int64()), ("output", pa.string()), ("error", pa.string()),
    ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64()), ("model", pa.string()),
    ("created_at", pa.string()), ("confidence", pa.float64()), ("reasoning", pa.string()), ("extra", pa.string()),
    ("truncated", pa.bool_()), ("finish_reason", pa.string()),
])
#: A stored answer: (output, error, confidence, the model that gave it, its thinking, what its
#: request asked beyond the text, whether it was cut at max_tokens, why it ended). The thinking is
#: stored only by jobs that keep it (``output.keep_reasoning``, part of the context); the extra only
#: by batch lines that ask for it. A cut answer is kept with its mark: the same prompt and settings
#: are cut the same. Segments written before the last two read them as null.
Answer = tuple[str | None, str | None, float | None, str | None, str | None, str | None, bool | None, str | None]
#: Segments of one level merged into one of the next level.
FAN_IN = 16


def open_store(spec: Any, home: JobHome, model_id: str) -> ResultStore:
    """The answer store of ``spec`` for ``model_id``: the home's (folder and bucket, when it was
    opened from the spec) or, for a home made by hand, the spec's folder."""
    root = home.results or spec.result_store_path
    later = home.remote.uploader.do if home.remote is not None else None
    return ResultStore(root, spec.answer_context(model_id), home.results_remote, later)


def prompt_key(system: str, user: str, sampling: Any = None, output: Any = None) -> str:
    """32 hex characters naming the answer to a column job's prompt of ``system`` and ``user``
    text under ``sampling`` / ``output`` (the job's defaults when None): what its output rows carry
    as ``prompt_key`` (:func:`..spec.identity.answer_key`; a draw has no key, so the sampling
    given here must not be one)."""
    key = RenderedPrompt(system, user).answer_key(sampling or SamplingSpec(), output or OutputSpec())
    if key is None:
        raise ValueError("a draw (temperature above 0, no seed) has no key in the result store")
    return key


def split_key(key: str) -> tuple[int, int]:
    """A prompt key as the store's two signed 64-bit columns."""
    raw = bytes.fromhex(key)
    return int.from_bytes(raw[:8], "big", signed=True), int.from_bytes(raw[8:16], "big", signed=True)


def split_keys(keys: list[str]) -> tuple[list[int], list[int]]:
    """:func:`split_key` of many keys, as the two columns: one parse for a shard's keys."""
    if any(len(k) != 32 for k in keys):
        pairs = [split_key(k) for k in keys]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    values = struct.unpack(f">{2 * len(keys)}q", bytes.fromhex("".join(keys)))
    return list(values[0::2]), list(values[1::2])


class ResultStore:
    """Stored answers of one context (one model, sampling and output spec).

    Example::

        store = ResultStore(spec.result_store_path, spec.answer_context(model_id))
        found = store.lookup(["3f2a..."])          # {prompt_key: (output, error, confidence, model, ...)}
        store.add(rows)                            # dicts with prompt_key, output, error, tokens, model
    """

    def __init__(self, root: Path, context: str, remote: Bucket | None = None,
                 later: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.dir = root / context
        self.context, self.remote = context, remote
        #: Runs the bucket's side of add() and the merges off the caller's thread, in order (a
        #: bucket home's upload thread, so a segment lands before the commit of the shard that made it).
        self._later = later or (lambda task: task())
        self._lock = FileLock(self.dir / ".lock")
        self._pulled = False
        # One DuckDB connection for every lookup of this store (opening one costs tens of
        # milliseconds of CPU, a shard's whole lookup as much again); one lookup at a time on it.
        self._con: Any = None
        self._con_lock = threading.Lock()

    def pull(self) -> None:
        """With a remote store: segments other boxes added come into the cache. A segment a merge
        elsewhere removed stays here (its answers twice, which a lookup does not mind): it may as
        well be one of ours whose upload is still queued."""
        if self.remote is None:
            return
        remote = {n for n in self.remote.list(self.context) if n.startswith("seg-") and n.endswith(".parquet")}
        for name in sorted(remote - {f.name for f in self.segments()}):
            try:
                self.remote.get_file(f"{self.context}/{name}", self.dir / name)
            except FileNotFoundError:  # merged away by another box since the listing: its merged one is there
                continue
        self._pulled = True

    def segments(self) -> list[Path]:
        return sorted(self.dir.glob("seg-*.parquet")) if self.dir.exists() else []

    def lookup(self, keys: list[str]) -> dict[str, Answer]:
        """Stored (output, error, confidence, model, reasoning, extra, truncated, finish_reason) of each key with an
        answer; keys
        without one are absent. Answers stored before confidences (thinking) were kept have none (None)."""
        if not keys:
            return {}
        if not self._pulled:
            self.pull()
        if not self.dir.exists():
            return {}
        try:
            return self._lookup(keys)
        except Exception as exc:  # a broken segment must cost a recompute, never the run
            if not self._quarantine_broken():
                raise
            log.warning("result store %s had a broken segment (%s): set aside, looking up again", self.dir, exc)
            return self._lookup(keys)

    def _lookup(self, keys: list[str]) -> dict[str, Answer]:
        from ..inputs.shards import connect

        k1, k2 = split_keys(keys)
        probe = pa.table({"i": pa.array(range(len(keys)), pa.int64()),
                          "k1": pa.array(k1, pa.int64()), "k2": pa.array(k2, pa.int64())})
        with self._lock.held(shared=True):
            files = [str(f) for f in self.segments()]
            if not files:
                return {}
            with self._con_lock:
                if self._con is None:
                    self._con = connect()
                con = self._con
                con.register("probe", probe)
                try:
                    hits = con.execute(
                        # One copy of a key (one struct: its output and confidence from the same copy);
                        # segments written before the confidence (reasoning) column read it as null.
                        "SELECT p.i, any_value(struct_pack(o := r.output, e := r.error, c := r.confidence, "
                        "m := r.model, t := r.reasoning, x := r.extra, u := r.truncated, f := r.finish_reason)) "
                        "FROM probe p JOIN (FROM read_parquet(?, union_by_name = true) "
                        f"{WITH_CONFIDENCE} {WITH_REASONING} {WITH_EXTRA} {WITH_TRUNCATED}) r "
                        "ON r.k1 = p.k1 AND r.k2 = p.k2 GROUP BY p.i",
                        [files]
                    ).fetchall()
                finally:
                    con.unregister("probe")
        return {keys[i]: (found["o"], found["e"], found["c"], found["m"], found["t"], found["x"], found["u"],
                          found["f"]) for i, found in hits}

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Store newly generated answers as one segment, then merge segments that piled up."""
        if not rows:
            return
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        k1, k2 = split_keys([r["prompt_key"] for r in rows])
        table = pa.table({
            "k1": k1, "k2": k2,
            "output": [r["output"] for r in rows], "error": [r["error"] for r in rows],
            "prompt_tokens": [r["prompt_tokens"] for r in rows], "output_tokens": [r["output_tokens"] for r in rows],
            "model": [r["model"] for r in rows], "created_at": [now] * len(rows),
            "confidence": [r.get("confidence") for r in rows], "reasoning": [r.get("reasoning") for r in rows],
            "extra": [r.get("extra") for r in rows], "truncated": [bool(r.get("truncated")) for r in rows],
            "finish_reason": [r.get("finish_reason") for r in rows],
        }, schema=SCHEMA)
        segment = self.dir / f"seg-L0-{uuid.uuid4().hex}.parquet"
        atomic_write_parquet(segment, table)
        if self.remote is None:
            self.compact()
            return
        self._later(lambda: self._upload(segment))
        self._later(self.compact)

    def _upload(self, segment: Path) -> None:
        # Gone: a merge queued before this upload took it in, and uploaded the merged segment.
        if self.remote is not None and segment.exists():
            self.remote.put_file(segment, f"{self.context}/{segment.name}")

    def compact(self) -> None:
        """Merge ``FAN_IN`` segments of a level into one of the next, level by level.

        One process merges at a time (a non-blocking lock: a busy merger means someone else
        is on it). The merged file is written first; the swap (rename in, delete inputs) waits
        for readers, so a lookup never sees a half-merged store.
        """
        merger = FileLock(self.dir / ".merge.lock")
        if not merger.acquire(wait=False):
            return
        try:
            level = 0
            while True:
                batch = sorted(self.dir.glob(f"seg-L{level}-*.parquet"))[:FAN_IN]
                if len(batch) < FAN_IN:
                    return
                merged = pa.concat_tables([pq.read_table(f, schema=SCHEMA) for f in batch])
                tmp = self.dir / f".merge-{uuid.uuid4().hex}.parquet"
                atomic_write_parquet(tmp, merged)
                out = self.dir / f"seg-L{level + 1}-{uuid.uuid4().hex}.parquet"
                if self.remote is not None:  # the merged one in the bucket before its inputs leave it
                    self.remote.put_file(tmp, f"{self.context}/{out.name}")
                    self.remote.delete(f"{self.context}/{f.name}" for f in batch)
                with self._lock.held():
                    os.replace(tmp, out)
                    for f in batch:
                        f.unlink(missing_ok=True)
                level += 1
        finally:
            merger.release()

    def _quarantine_broken(self) -> bool:
        """Rename unreadable segments out of the lookup's way; True when one was found."""
        found = False
        with self._lock.held():
            for f in self.segments():
                try:
                    pq.read_metadata(f)
                except Exception:  # truncated or not Parquet: either way unusable
                    f.rename(f.with_name(f.name + ".broken"))
                    found = True
        return found
