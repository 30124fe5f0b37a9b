"""``sparkbatch serve-batch``'s store (serve/store.py): a File is a typed record
(``serve_batch_models.FileObject``) whose JSON on disk is the one earlier servers wrote, so an
old ``--root`` still reads; the store's listeners hear each change of a batch's status once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkbatch_dagster import ConfigError
from sparkbatch_dagster.serve.openai_models import FileObject
from sparkbatch_dagster.serve.store import Store, new_batch

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def _old_record(fid: str, size: int, created: int, purpose: str = "batch") -> str:
    """A FileObject's JSON exactly as the store wrote it before File was a typed record."""
    return json.dumps({"id": fid, "object": "file", "bytes": size, "created_at": created, "filename": "in.jsonl",
                       "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None})


def test_an_old_stores_files_read_and_a_new_file_is_written_as_before(tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "file-old.json").write_text(_old_record("file-old", len(LINE), 1_796_000_000))
    (files / "file-old.jsonl").write_bytes(LINE)
    store = Store(tmp_path)
    old = store.file("file-old")
    assert isinstance(old, FileObject)
    assert (old.id, old.bytes, old.created_at, old.purpose, old.status) == ("file-old", len(LINE), 1_796_000_000,
                                                                           "batch", "processed")
    new = store.add_file(LINE, "in.jsonl", "batch")
    assert isinstance(new, FileObject) and store.file(new.id) == new
    assert (files / f"{new.id}.json").read_text() == _old_record(new.id, len(LINE), new.created_at)  # byte for byte
    assert [f.id for f in store.all_files()] == ["file-old", new.id]  # oldest first
    assert new_batch(store, {"input_file_id": "file-old", "endpoint": "/v1/chat/completions"})["status"] == "validating"


def test_a_damaged_file_record_is_not_listed(tmp_path: Path) -> None:
    store = Store(tmp_path)
    (store.files / "file-torn.json").write_text('{"id": "file-torn", "obj')
    (store.files / "file-odd.json").write_text('{"id": 7}')
    kept = store.add_file(LINE, "in.jsonl", "batch")
    assert [f.id for f in store.all_files()] == [kept.id]
    assert store.file("file-torn") is None and store.file("file-odd") is None


def test_a_batch_reads_only_a_batch_upload(tmp_path: Path) -> None:
    store = Store(tmp_path)
    result = store.add_file(LINE, "output.jsonl", "batch_output")
    with pytest.raises(ConfigError, match="purpose 'batch_output'.*purpose='batch'"):
        new_batch(store, {"input_file_id": result.id, "endpoint": "/v1/chat/completions"})
    with pytest.raises(ConfigError, match="upload it with files.create"):
        new_batch(store, {"input_file_id": 3, "endpoint": "/v1/chat/completions"})


def test_listeners_hear_each_change_of_status_once(tmp_path: Path) -> None:
    store = Store(tmp_path)
    upload = store.add_file(LINE, "in.jsonl", "batch")
    heard: list[tuple[str, str]] = []
    store.listeners.append(lambda b: heard.append((b["id"], b["status"])))
    bid = new_batch(store, {"input_file_id": upload.id, "endpoint": "/v1/chat/completions"})["id"]
    store.update(bid, status="in_progress", in_progress_at=1)
    store.update(bid, request_counts={"total": 1, "completed": 1, "failed": 0})  # no change of status: not heard
    store.update(bid, status="finalizing", finalizing_at=2)
    assert heard == [(bid, "in_progress"), (bid, "finalizing")]
