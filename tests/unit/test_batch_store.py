"""``sparkbatch serve-batch``'s store (serve/store.py): a File (``openai_models.FileObject``) and a
batch (``record.BatchRecord``) are typed records whose JSON on disk is the one earlier servers
wrote, so an old ``--root`` still reads; a batch changes by ``Store.update`` only, checked as a
loaded record is; the store's listeners hear each change of a batch's status once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkbatch_dagster import ConfigError
from sparkbatch_dagster.serve.anthropic_batches import message_batch
from sparkbatch_dagster.serve.openai_batches import openai_batch
from sparkbatch_dagster.serve.openai_models import FileObject, RequestCounts
from sparkbatch_dagster.serve.record import BatchRecord, Changes
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
    assert new_batch(store, {"input_file_id": "file-old", "endpoint": "/v1/chat/completions"}).status == "validating"


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
    store.listeners.append(lambda b: heard.append((b.id, b.status)))
    bid = new_batch(store, {"input_file_id": upload.id, "endpoint": "/v1/chat/completions"}).id
    store.update(bid, status="in_progress", in_progress_at=1)
    store.update(bid, request_counts=RequestCounts(total=1, completed=1, failed=0))  # no change of status: not heard
    store.update(bid, status="finalizing", finalizing_at=2)
    assert heard == [(bid, "in_progress"), (bid, "finalizing")]


#: An OpenAI batch's record exactly as the store wrote it while a batch was the dict of its JSON
#: (new_batch's keys, then the ending's: usage, reused_requests, an errors list).
OLD_OPENAI = {
    "id": "batch_0123", "object": "batch", "endpoint": "/v1/chat/completions",
    "errors": {"object": "list", "data": [{"code": "run_failed", "message": "EngineError: died", "param": None,
                                           "line": None}]},
    "input_file_id": "file-old", "completion_window": "24h", "status": "failed", "output_file_id": "file-out",
    "error_file_id": "file-err", "created_at": 1_796_000_000, "in_progress_at": 1_796_000_001,
    "expires_at": 1_796_086_400, "finalizing_at": None, "completed_at": None, "failed_at": 1_796_000_050,
    "expired_at": None, "cancelling_at": None, "cancelled_at": None, "metadata": {"job": "nightly"},
    "model": "m@1", "request_counts": {"total": 3, "completed": 1, "failed": 2},
    "usage": {"input_tokens": 7, "output_tokens": 5, "total_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
              "output_tokens_details": {"reasoning_tokens": 0}},
    "reused_requests": 0}
#: A Message Batch's record as anthropic_create wrote it, cancelled (no endpoint, no file ids).
OLD_MESSAGE_BATCH = {
    "id": "msgbatch_0456", "format": "anthropic_batch", "status": "cancelled",
    "input_file_id": "msgbatch_0456-requests", "created_at": 1_796_000_000, "in_progress_at": 1_796_000_000,
    "expires_at": 1_796_086_400,
    "cancelling_at": 1_796_000_010, "completed_at": None, "cancelled_at": 1_796_000_020, "expired_at": None,
    "failed_at": None, "request_counts": {"total": 4, "completed": 1, "failed": 3}, "model": "m@1",
    "reused_requests": 0, "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
                                    "input_tokens_details": {"cached_tokens": 0},
                                    "output_tokens_details": {"reasoning_tokens": 0}},
    "unrun_requests": 2}


def test_an_old_stores_batches_load_and_render_as_they_did(tmp_path: Path) -> None:
    from anthropic.types.messages import MessageBatch
    from openai.types import Batch

    store = Store(tmp_path)
    for old in (OLD_OPENAI, OLD_MESSAGE_BATCH):
        (store.batches / f"{old['id']}.json").write_text(json.dumps(old))
    assert [b.id for b in store.all_batches()] == ["msgbatch_0456", "batch_0123"]  # newest first, then by id
    openai_record, anthropic_record = store.batch("batch_0123"), store.batch("msgbatch_0456")
    assert openai_record is not None and anthropic_record is not None
    assert (openai_record.format, anthropic_record.format) == ("openai_batch", "anthropic_batch")
    # The OpenAI object is the old record, key for key (the store's "object" was always "batch").
    assert openai_batch(openai_record).model_dump(mode="json") == OLD_OPENAI
    assert Batch.model_validate(openai_batch(openai_record).model_dump()).errors.data[0].code == "run_failed"
    wire = MessageBatch.model_validate(message_batch(anthropic_record, "http://h/").model_dump())
    assert (wire.processing_status, wire.request_counts.succeeded, wire.request_counts.errored,
            wire.request_counts.canceled) == ("ended", 1, 1, 2)
    assert wire.results_url == "http://h/v1/messages/batches/msgbatch_0456/results"
    # Changed and written again, each keeps every field it had.
    changed = store.update("batch_0123", metadata={"job": "again"})
    assert changed.model_dump(exclude={"metadata"}) == openai_record.model_dump(exclude={"metadata"})
    assert store.batch("batch_0123") == changed
    kept = json.loads((store.batches / "batch_0123.json").read_text())
    assert {k: kept[k] for k in OLD_OPENAI if k != "object"} == {
        **{k: v for k, v in OLD_OPENAI.items() if k != "object"}, "metadata": {"job": "again"}}


def test_an_update_is_checked_as_a_loaded_record_is(tmp_path: Path) -> None:
    store = Store(tmp_path)
    (store.batches / "batch_1.json").write_text(json.dumps(OLD_OPENAI | {"id": "batch_1"}))
    with pytest.raises(ValueError, match="status"):
        store.update("batch_1", status="done")  # type: ignore[typeddict-item]
    with pytest.raises(TypeError, match="request_count"):
        store.update("batch_1", **{"request_count": 3})  # type: ignore[arg-type]
    assert store.batch("batch_1") == BatchRecord.model_validate(OLD_OPENAI | {"id": "batch_1"})  # unchanged
    (store.batches / "batch_2.json").write_text(json.dumps({"id": "batch_2", "status": "lost"}))
    assert store.batch("batch_2") is None and [b.id for b in store.all_batches()] == ["batch_1"]  # damaged: unlisted


def test_changes_name_every_field_but_the_id() -> None:
    assert set(Changes.__annotations__) == set(BatchRecord.model_fields) - {"id"}
