"""Anthropic's Message Batches on ``sparkbatch serve-batch``, in-process (FastAPI's TestClient, a
worker never started, so a batch stays queued unless the test ends it): what the live walk with
the ``anthropic`` client (tests/e2e/test_anthropic_batches.py) does not reach: a failed run's
requests as ``errored`` results, the list cursors at their edges, what a delete removes, and the
two APIs' batches kept apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sparkbatch_dagster.serve.app import make_app
from sparkbatch_dagster.serve.guard import access
from sparkbatch_dagster.serve.worker import Store, Worker
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource

anthropic = pytest.importorskip("anthropic")
PATH = "/v1/messages/batches"


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, Store, Worker]:
    store = Store(tmp_path / "root")
    worker = Worker(store, [], FakeVLLMResource(), SamplingSpec(max_tokens=8), 10, 0.79)  # never started
    return TestClient(make_app(store, worker, access("127.0.0.1", None)), base_url="http://127.0.0.1:8400"), \
        store, worker


def _create(client: TestClient, *ids: str) -> Any:
    from anthropic.types.messages import MessageBatch

    requests = [{"custom_id": cid, "params": {"model": "m", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": cid}]}} for cid in ids]
    answer = client.post(PATH, json={"requests": requests})
    assert answer.status_code == 200, answer.text
    return MessageBatch.model_validate_json(answer.text, strict=True)


def test_a_failed_run_ends_the_batch_with_each_request_errored(served):
    from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

    client, store, worker = served
    batch = _create(client, "a", "b")
    worker._finish(batch.id, "failed", "the engine would not start")  # as the worker ends a run that failed
    ended = MessageBatch.model_validate_json(client.get(f"{PATH}/{batch.id}").text, strict=True)
    assert ended.processing_status == "ended" and ended.ended_at and ended.results_url
    assert ended.request_counts.model_dump() == {"processing": 0, "succeeded": 0, "errored": 2, "canceled": 0,
                                                 "expired": 0}
    results = client.get(f"{PATH}/{batch.id}/results")
    lines = [MessageBatchIndividualResponse.model_validate_json(x, strict=True) for x in results.text.splitlines()]
    assert [line.custom_id for line in lines] == ["a", "b"]
    for line in lines:
        assert line.result.type == "errored" and line.result.error.error.type == "api_error"
        assert "the engine would not start" in line.result.error.error.message


def test_the_list_cursors_at_their_edges(served):
    client, _, _ = served
    ids = [_create(client, "x").id for _ in range(3)][::-1]  # newest first

    def page(**params: Any) -> tuple[list[str], bool]:
        body = client.get(PATH, params=params).json()
        return [b["id"] for b in body["data"]], body["has_more"]

    assert page() == (ids, False)
    assert page(limit=1) == (ids[:1], True)
    assert page(after_id=ids[0], limit=1) == (ids[1:2], True) and page(after_id=ids[1]) == (ids[2:], False)
    assert page(before_id=ids[2], limit=1) == (ids[1:2], True) and page(before_id=ids[1]) == (ids[:1], False)
    assert page(after_id=ids[0], before_id=ids[2]) == (ids[1:2], False)
    assert page(after_id="msgbatch_unknown") == ([], False) and page(before_id=ids[0]) == ([], False)
    for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "many"}):
        assert client.get(PATH, params=bad).json()["error"]["type"] == "invalid_request_error"
    assert client.get(PATH, params={"limit": 1000}).status_code == 200


def test_a_delete_removes_the_batch_its_requests_and_its_results(served):
    client, store, worker = served
    batch = _create(client, "a")
    record = store.batch(batch.id)
    assert record is not None and store.file_path(record.input_file_id).is_file()
    assert json.loads(store.file_path(record.input_file_id).read_text())["custom_id"] == "a"
    assert client.delete(f"{PATH}/{batch.id}").status_code == 400  # in progress: cancel first
    assert client.get(f"{PATH}/{batch.id}/results").status_code == 400  # no results before it ends
    assert client.post(f"{PATH}/{batch.id}/cancel").json()["processing_status"] == "ended"  # queued: at once
    assert client.delete(f"{PATH}/{batch.id}").json() == {"id": batch.id, "type": "message_batch_deleted"}
    assert store.batch(batch.id) is None and not store.folder(batch.id).exists()
    assert not store.file_path(record.input_file_id).exists()
    assert client.get(f"{PATH}/{batch.id}").status_code == 404
    assert client.get("/v1/files").json()["data"] == []  # a Message Batch's requests were never a File


def test_the_two_apis_batches_are_kept_apart(served):
    client, store, _ = served
    message_batch = _create(client, "a")
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "a"}]}}).encode()
    fid = client.post("/v1/files", files={"file": ("r.jsonl", line)}, data={"purpose": "batch"}).json()["id"]
    openai_batch = client.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}).json()
    assert [b["id"] for b in client.get("/v1/batches").json()["data"]] == [openai_batch["id"]]
    assert [b["id"] for b in client.get(PATH).json()["data"]] == [message_batch.id]
    assert client.get(f"/v1/batches/{message_batch.id}").json()["error"]["code"] == "not_found"
    assert client.get(f"{PATH}/{openai_batch['id']}").json()["error"]["type"] == "not_found_error"
    assert {b.id for b in store.all_batches()} == {message_batch.id, openai_batch["id"]}  # one queue
