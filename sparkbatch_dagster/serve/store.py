"""The files and batches of ``sparkbatch serve-batch`` on disk (:class:`Store`), and a new OpenAI
batch (:func:`new_batch`); :mod:`.worker` runs the batches.

Everything lives under one folder, so a server killed at any moment and started again on the same
``--root`` carries on::

    files/<file-id>.jsonl, files/<file-id>.json     an uploaded file and its FileObject
    files/<msgbatch-id>-requests.jsonl              a Message Batch's requests (no FileObject: not listed)
    batches/<batch-id>.json                         the batch's record (status, file ids, times); a Message
                                                    Batch's is the same, its "format" anthropic_batch
    batches/<batch-id>/home/                        the batch's job: shards, checkpoints, commits
    batches/<batch-id>/output.jsonl, errors.jsonl   its result files, written when it ends

Each object file is replaced whole (:func:`write_json`): a reader never sees half of one. A file
is a typed record, :class:`.openai_models.FileObject`, written as the JSON earlier servers
wrote (the same fields in the same order), so an old ``--root`` reads; a batch is a
:class:`.record.BatchRecord`, whose JSON an old ``--root`` holds too. A batch changes only by
:meth:`Store.update`, under the store's lock: a read, the change, a write, so two threads
changing one batch never lose each other's fields. Listeners (:attr:`Store.listeners`) hear each
change of a batch's status.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from typing_extensions import Unpack

from ..errors import ConfigError
from .openai_models import FileObject, RequestCounts
from .record import ENDPOINT, MESSAGE_BATCH, BatchRecord, Changes

M = TypeVar("M", bound=BaseModel)


def now() -> int:
    return int(time.time())


def write_json(path: Path, obj: dict[str, Any]) -> None:
    """``obj`` at ``path``, replaced whole: a reader (or a server killed mid-write) never sees half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


class Store:
    """The files and batches under ``root`` (see the module's docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files, self.batches = root / "files", root / "batches"
        self.files.mkdir(parents=True, exist_ok=True)
        self.batches.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        #: Called with the Batch after each change of its status, after the write, in the thread
        #: that made it (outside the store's lock unless that caller holds it): what follows a
        #: batch's statuses (a test holds the worker at ``finalizing`` with one).
        self.listeners: list[Callable[[BatchRecord], None]] = []

    def add_file(self, data: bytes | Path, filename: str, purpose: str) -> FileObject:
        """Keep an uploaded file (or move a result file in); return its FileObject."""
        fid = f"file-{secrets.token_hex(12)}"
        path = self.files / f"{fid}.jsonl"
        if isinstance(data, Path):
            os.replace(data, path)
        else:
            path.write_bytes(data)
        meta = FileObject(id=fid, bytes=path.stat().st_size, created_at=now(), filename=filename, purpose=purpose,
                          status="processed")
        write_json(self.files / f"{fid}.json", meta.model_dump(mode="json"))  # the fields in OpenAI's order
        return meta

    def file(self, fid: str) -> FileObject | None:
        return _record_at(self.files / f"{_safe(fid)}.json", FileObject)

    def file_path(self, fid: str) -> Path:
        return self.files / f"{_safe(fid)}.jsonl"

    def all_files(self) -> list[FileObject]:
        """Every FileObject, oldest first (``files.list`` pages them either way): by ``created_at``,
        then by when its object was written (files made in the same second keep their order)."""
        found = [(f, _mtime(p)) for p in self.files.glob("file-*.json") if (f := _record_at(p, FileObject)) is not None]
        return [f for f, _ in sorted(found, key=lambda fw: (fw[0].created_at, fw[1], fw[0].id))]

    def delete_file(self, fid: str) -> None:
        """Forget a file: its object first (it is gone for every reader), then its bytes."""
        with self.lock:
            (self.files / f"{_safe(fid)}.json").unlink(missing_ok=True)
            self.file_path(fid).unlink(missing_ok=True)

    def batch(self, bid: str) -> BatchRecord | None:
        """Batch ``bid`` (None: no such batch, or a damaged record, which is not listed either)."""
        return _record_at(self.batches / f"{_safe(bid)}.json", BatchRecord)

    def save(self, batch: BatchRecord) -> BatchRecord:
        """Write a new batch (a create's); a stored one changes by :meth:`update`."""
        with self.lock:
            write_json(self.batches / f"{_safe(batch.id)}.json", batch.model_dump(mode="json"))
        return batch

    def update(self, bid: str, **changes: Unpack[Changes]) -> BatchRecord:
        """Batch ``bid`` (stored) with ``changes``, written; the listeners hear a change of status."""
        with self.lock:
            batch = self.batch(bid)
            assert batch is not None, bid
            saved = self.save(batch.changed(**changes))
        if saved.status != batch.status:
            for listener in self.listeners:
                listener(saved)
        return saved

    def all_batches(self) -> list[BatchRecord]:
        """Newest first, as the Batches API lists them: OpenAI's batches and Anthropic's Message
        Batches (``format`` ``anthropic_batch``) alike, one queue for the worker."""
        found = [b for pattern in ("batch_*.json", "msgbatch_*.json") for p in self.batches.glob(pattern)
                 if (b := _record_at(p, BatchRecord)) is not None]
        return sorted(found, key=lambda b: (b.created_at, b.id), reverse=True)

    def delete_batch(self, bid: str) -> None:
        """Forget an ended batch: its object first (gone for every reader), then its job's folder
        and its stored requests (a Message Batch's; an OpenAI batch's input is a file of its own)."""
        with self.lock:
            batch = self.batch(bid)
            (self.batches / f"{_safe(bid)}.json").unlink(missing_ok=True)
            shutil.rmtree(self.folder(bid), ignore_errors=True)
            if batch is not None and batch.format == MESSAGE_BATCH:
                self.file_path(batch.input_file_id).unlink(missing_ok=True)

    def folder(self, bid: str) -> Path:
        return self.batches / _safe(bid)


def _safe(name: str) -> str:
    """An id as a file name: nothing that walks out of the folder."""
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return "-invalid-"
    return name


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # deleted meanwhile
        return 0


def _record_at(path: Path, kind: type[M]) -> M | None:
    """The ``kind`` stored at ``path`` (None: gone, or not one: a damaged record is not listed)."""
    try:
        return kind.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None

def new_batch(store: Store, body: dict[str, Any]) -> BatchRecord:
    """A Batch object for ``body`` (``batches.create``'s), checked: a ConfigError names what is wrong."""
    fid = body.get("input_file_id")
    if not isinstance(fid, str) or (meta := store.file(fid)) is None:
        raise ConfigError(f"input_file_id {fid!r} is not a file on this server: upload it with files.create first")
    if meta.purpose != "batch":  # OpenAI's: a batch reads only a file uploaded for one (not a result file)
        raise ConfigError(f"input_file_id {fid!r} has purpose {meta.purpose!r}: upload the requests with "
                          "files.create(purpose='batch') and create the batch from that file")
    if body.get("endpoint") != ENDPOINT:
        raise ConfigError(f"endpoint {body.get('endpoint')!r} is not served here: use {ENDPOINT!r}")
    if body.get("completion_window", "24h") != "24h":
        raise ConfigError(f"completion_window {body.get('completion_window')!r}: use '24h'")
    with store.file_path(fid).open("rb") as fh:  # line by line: never the whole file in memory
        lines = sum(1 for line in fh if line.strip())
    created = now()
    return store.save(BatchRecord(
        id=f"batch_{secrets.token_hex(12)}", input_file_id=fid, status="validating", created_at=created,
        expires_at=created + 86400, metadata=body.get("metadata"),
        request_counts=RequestCounts(total=lines, completed=0, failed=0)))
