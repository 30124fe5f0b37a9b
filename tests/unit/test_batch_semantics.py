"""OpenAI's Files and Batch semantics of ``sparkbatch serve-batch``, in-process (FastAPI's
TestClient, a worker never started): ``files.list`` (purpose, limit, after, order) and
``files.delete``, every answer parsed with the ``openai`` package's own types; a Batch's
``usage`` and ``model`` from its rows. The same against a live server and real runs:
tests/e2e/test_batch_semantics.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sparkbatch_dagster.run.batch_export import usage_of
from sparkbatch_dagster.serve.app import make_app
from sparkbatch_dagster.serve.ending import usage_fields
from sparkbatch_dagster.serve.guard import access
from sparkbatch_dagster.serve.openai_batches import openai_batch
from sparkbatch_dagster.serve.record import BatchRecord
from sparkbatch_dagster.serve.validate import validate_file
from sparkbatch_dagster.serve.worker import Store, Worker
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource

openai = pytest.importorskip("openai")
LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"messages": [{"role": "user", "content": "hi"}]}}).encode() + b"\n"


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, Store]:
    store = Store(tmp_path / "root")
    # Never started: a batch stays queued.
    worker = Worker(store, [], FakeVLLMResource(), SamplingSpec(max_tokens=8), 10, 0.79)
    return TestClient(make_app(store, worker, access("127.0.0.1", None)), base_url="http://127.0.0.1:8400"), store


def _upload(client: TestClient, name: str) -> str:
    answer = client.post("/v1/files", files={"file": (name, LINE)}, data={"purpose": "batch"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def _page(client: TestClient, **params: Any) -> Any:
    from openai.pagination import SyncCursorPage
    from openai.types import FileObject

    answer = client.get("/v1/files", params=params)
    assert answer.status_code == 200, answer.text
    return SyncCursorPage[FileObject].model_validate(answer.json())


def test_files_list_pages_filters_and_orders(served):
    client, store = served
    ids = [_upload(client, f"r{i}.jsonl") for i in range(3)]
    result = store.add_file(b"{}\n", "output.jsonl", "batch_output").id  # a batch's result file
    newest_first = [f.id for f in _page(client).data]
    assert newest_first == [f.id for f in store.all_files()][::-1] and set(newest_first) == {*ids, result}
    assert [f.id for f in _page(client, order="asc").data] == newest_first[::-1]
    assert {f.id for f in _page(client, purpose="batch").data} == set(ids)
    assert [f.id for f in _page(client, purpose="batch_output").data] == [result]
    first = _page(client, limit=2)
    assert len(first.data) == 2 and first.has_more
    rest = _page(client, limit=2, after=first.data[-1].id)
    assert [f.id for f in first.data + rest.data] == newest_first and not rest.has_more
    assert _page(client, after="file-unknown").data == []
    for bad in ({"limit": 0}, {"limit": 10_001}, {"order": "up"}):
        assert client.get("/v1/files", params=bad).status_code == 400


def test_files_delete_forgets_the_file_unless_an_open_batch_reads_it(served):
    from openai.types import FileDeleted

    client, store = served
    fid, used = _upload(client, "a.jsonl"), _upload(client, "b.jsonl")
    deleted = FileDeleted.model_validate(client.delete(f"/v1/files/{fid}").json())
    assert deleted.id == fid and deleted.deleted and deleted.object == "file"
    assert client.get(f"/v1/files/{fid}").status_code == 404
    assert client.get(f"/v1/files/{fid}/content").status_code == 404
    assert fid not in {f.id for f in _page(client).data} and not store.file_path(fid).exists()
    gone = client.delete(f"/v1/files/{fid}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    bid = client.post("/v1/batches", json={"input_file_id": used, "endpoint": "/v1/chat/completions",
                                           "completion_window": "24h"}).json()["id"]
    refused = client.delete(f"/v1/files/{used}")  # the queued batch still reads it
    assert refused.status_code == 400 and bid in refused.json()["error"]["message"]
    assert client.get(f"/v1/files/{used}/content").content == LINE


def _row(prompt: int, output: int, *, error: str | None = None, reused: bool = False, dedup: bool = False,
         model: str | None = "m") -> dict[str, Any]:
    return {"prompt_tokens": prompt, "output_tokens": output, "cached_tokens": 0, "reasoning_tokens": 0,
            "error": error, "reused": reused, "deduplicated": dedup, "model": model}


def test_a_batchs_usage_is_what_its_rows_cost():
    from openai.types import Batch

    rows = [_row(10, 3), _row(0, 0, reused=True), _row(0, 0, dedup=True), _row(7, 5, error="bad_output: x")]
    summary = usage_of(rows)
    assert summary.to_json() == {"input_tokens": 17, "output_tokens": 8, "cached_tokens": 0, "reasoning_tokens": 0,
                                 "reused": 2, "model": "m"}
    record = BatchRecord(id="batch_1", input_file_id="file-1", status="completed", created_at=1, expires_at=2,
                         **usage_fields(summary))
    batch = Batch.model_validate(openai_batch(record).model_dump())
    assert batch.usage is not None and (batch.usage.input_tokens, batch.usage.total_tokens) == (17, 25)
    assert batch.model == "m" and batch.model_extra == {"reused_requests": 2}
    assert usage_of([]).model is None


def _request(cid: Any, url: str = "/v1/chat/completions") -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url,
                       "body": {"messages": [{"role": "user", "content": "hi"}]}})


def test_a_file_openai_would_refuse_fails_validation_line_by_line(tmp_path: Path):
    from openai.types import BatchError

    lines = [_request("a"), "", "{not json", _request("b"), _request("a"), _request("c", "/v1/embeddings"),
             "[1, 2]", _request(None), json.dumps({"custom_id": "nul\x00", "url": "/v1/chat/completions"}),
             b'{"custom_id": "raw", "url": "/v1/chat/completions", "body": {"x": "a\x00b"}}'.decode()]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    found = validate_file(tmp_path / "in.jsonl", "/v1/chat/completions")
    problems = [BatchError.model_validate(p.model_dump()) for p in found]  # OpenAI's own type
    assert [(p.line, p.code) for p in problems] == [
        (3, "invalid_json_line"), (5, "duplicate_custom_id"), (6, "url_mismatch"), (7, "invalid_json_line"),
        (8, "missing_required_parameter")]  # line 10's raw NUL: that request's own error line, as issue 49 has it
    assert "line 1" in problems[1].message and problems[2].param == "url"
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert [p.code for p in validate_file(tmp_path / "empty.jsonl", "/v1/chat/completions")] == ["empty_file"]
    (tmp_path / "good.jsonl").write_text(_request("a") + "\n" + _request("b") + "\n")
    assert validate_file(tmp_path / "good.jsonl", "/v1/chat/completions") == []


def _wire(store: Store, bid: str) -> Any:
    """Stored batch ``bid`` as OpenAI's client parses it (the route's rendering, the SDK's type)."""
    from openai.types import Batch

    record = store.batch(bid)
    assert record is not None
    return Batch.model_validate(openai_batch(record).model_dump())


def test_the_worker_fails_a_bad_file_and_puts_a_good_one_in_progress(served):
    client, store = served
    worker = Worker(store, [], FakeVLLMResource(), SamplingSpec(max_tokens=8), 10, 0.79)
    create = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}

    def batch_of(data: bytes) -> str:
        fid = client.post("/v1/files", files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}).json()["id"]
        return str(client.post("/v1/batches", json={"input_file_id": fid, **create}).json()["id"])

    bad, good = batch_of(LINE + b"{oops\n" + LINE), batch_of(LINE)
    worker._validate(bad)
    worker._validate(good)
    failed, started = _wire(store, bad), _wire(store, good)
    assert failed.status == "failed" and failed.failed_at and failed.errors and failed.in_progress_at is None
    assert [(e.line, e.code) for e in failed.errors.data] == [(2, "invalid_json_line"), (3, "duplicate_custom_id")]
    assert failed.output_file_id is None and failed.error_file_id is None
    assert started.status == "in_progress" and started.in_progress_at and worker.queue.get_nowait() == good
    assert worker.queue.empty()


def test_a_batch_past_its_completion_window_expires_with_its_requests_as_batch_expired_lines(served):
    from openai.types import Batch

    client, store = served
    worker = Worker(store, [], FakeVLLMResource(), SamplingSpec(max_tokens=8), 10, 0.79)
    data = LINE + _request("b").encode() + b"\n"
    fid = client.post("/v1/files", files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}).json()["id"]
    bid = client.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions",
                                           "completion_window": "24h"}).json()["id"]
    worker._validate(bid)  # in progress, waiting for its turn
    created = _wire(store, bid)
    assert created.expires_at == created.created_at + 24 * 3600
    assert worker.expire_due(at=created.expires_at - 1) == [] and _wire(store, bid).status == "in_progress"
    assert worker.expire_due(at=created.expires_at) == [bid]
    expired = Batch.model_validate(client.get(f"/v1/batches/{bid}").json())
    assert expired.status == "expired" and expired.expired_at and expired.output_file_id is None
    assert expired.request_counts is not None and (expired.request_counts.completed, expired.request_counts.failed) \
        == (0, 2)
    assert expired.error_file_id is not None
    lines = [json.loads(x) for x in client.get(f"/v1/files/{expired.error_file_id}/content").text.splitlines()]
    assert [(x["custom_id"], x["response"], x["error"]["code"]) for x in lines] == [
        ("a", None, "batch_expired"), ("b", None, "batch_expired")]
    assert worker.expire_due(at=created.expires_at + 1) == []  # ended: nothing more
