"""Anthropic's Message Batches API on ``sparkbatch serve-batch``, walked by the unchanged
``anthropic`` client: the conformance test. Every MessageBatch the server returns is checked
field by field against docs/batch-files.md's table and parsed by the SDK's own type in strict
mode, every result line too (tests/support/message_batches.py).

Servers run as in tests/e2e/test_serve_batch.py (their own process, the fake engine whose gate
holds a run mid-batch until the test opens it), except for expiry, which needs the worker's clock
hook: that server runs in this process (uvicorn on loopback, the worker's runs in children).
No sleep decides anything: each wait is for a state the server reports.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from message_batches import conforms, message_requests, result_lines

from e2e.test_serve_batch import ROOT, Server
from sparkbatch_dagster.engines.server.server_process import free_port
from testkit import wait_until

anthropic = pytest.importorskip("anthropic")
N = 30  # requests (and bad-0); shards of 10
KEY = "anthropic-key"


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def _client(port: int, key: str | None = None) -> Any:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=key or "unused", max_retries=0)


def _create(client: Any, requests: list[dict[str, Any]]) -> Any:
    return conforms(client.messages.batches.with_raw_response.create(requests=requests).text())


def _retrieve(client: Any, bid: str) -> Any:
    return conforms(client.messages.batches.with_raw_response.retrieve(bid).text())


def _answered(root: Path, client: Any, bid: str, least: int) -> bool:
    """Whether ``least`` rows of the batch are answered: the client's retrieve makes the server
    count them into its stored record, which Anthropic's object shows only once the batch ends."""
    _retrieve(client, bid)
    return int(json.loads((root / "batches" / f"{bid}.json").read_text())["request_counts"]["completed"]) >= least


def _ended(client: Any, bid: str, explain: Any = lambda: "") -> Any:
    return wait_until(f"{bid} to end", lambda: (b := _retrieve(client, bid)).processing_status == "ended" and b,
                      explain, 300)


def _results(client: Any, batch: Any, key: str | None = None) -> dict[str, Any]:
    """The results through the SDK (every line a MessageBatchIndividualResponse), and the same
    raw bytes from ``results_url`` (with Anthropic's own ``x-api-key`` header) parsed strictly."""
    from anthropic.types.messages import MessageBatchIndividualResponse

    through_sdk = list(client.messages.batches.results(batch.id))
    assert all(isinstance(line, MessageBatchIndividualResponse) for line in through_sdk)
    raw = httpx.get(batch.results_url, headers={"x-api-key": key or "", "anthropic-version": "2023-06-01"})
    assert raw.status_code == 200, raw.text
    lines = result_lines(raw.content)
    assert sorted(line.custom_id for line in through_sdk) == sorted(lines)
    return lines


def _kinds(lines: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    for result in lines.values():
        found[result.type] = found.get(result.type, 0) + 1
    return found


def test_the_anthropic_client_walks_batches_through_every_status(tmp_path, servers):
    gate = tmp_path / "gate"
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)",
                                    api_key=KEY))
    client, root, requests = _client(server.port, KEY), tmp_path / "root", message_requests(N)
    sent = client.messages.batches.with_raw_response.list().http_request.headers  # the client's own headers
    assert sent["authorization"] == f"Bearer {KEY}" and sent["anthropic-version"]
    first = _create(client, requests)
    assert first.id.startswith("msgbatch_") and first.processing_status == "in_progress"
    assert first.request_counts.processing == N + 1 and first.results_url is None and first.ended_at is None
    server.wait(lambda: _answered(root, client, first.id, 10), "a shard answered, the engine held at its gate")
    running = _retrieve(client, first.id)  # Anthropic's counts: all processing until the whole batch ends
    assert running.processing_status == "in_progress" and running.request_counts.processing == N + 1
    second = _create(client, message_requests(5, "again", bad=False))  # queued behind the first
    third = _create(client, message_requests(4, "third", bad=False))
    # Newest first, two a page: the client follows the after_id cursor, and before_id goes back.
    assert [b.id for b in client.messages.batches.list(limit=2)] == [third.id, second.id, first.id]
    page = client.messages.batches.with_raw_response.list(limit=2)
    listed = json.loads(page.text())
    assert [conforms(json.dumps(b)).id for b in listed["data"]] == [third.id, second.id] and listed["has_more"]
    assert (listed["first_id"], listed["last_id"]) == (third.id, second.id)
    back = client.messages.batches.list(before_id=first.id, limit=1)
    assert [b.id for b in back.data] == [second.id] and back.has_more
    assert [b.id for b in client.messages.batches.list(after_id=second.id).data] == [first.id]
    # A queued batch cancelled: it ends at once, every request canceled.
    cancelled = conforms(client.messages.batches.with_raw_response.cancel(third.id).text())
    assert cancelled.processing_status == "ended" and cancelled.cancel_initiated_at and cancelled.results_url
    assert cancelled.request_counts.model_dump() == {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 4,
                                                     "expired": 0}
    assert _kinds(_results(client, cancelled, KEY)) == {"canceled": 4}
    with pytest.raises(anthropic.BadRequestError, match="cancel it") as refused:  # not while it runs
        client.messages.batches.delete(first.id)
    assert refused.value.body["error"]["type"] == "invalid_request_error" and refused.value.body["type"] == "error"
    from anthropic.types.messages import DeletedMessageBatch

    deleted = client.messages.batches.with_raw_response.delete(third.id).text()
    assert DeletedMessageBatch.model_validate_json(deleted, strict=True).model_dump() == {
        "id": third.id, "type": "message_batch_deleted"}
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(third.id)
    gate.touch()
    done = _ended(client, first.id)
    assert done.request_counts.model_dump() == {"processing": 0, "succeeded": N, "errored": 1, "canceled": 0,
                                                "expired": 0}
    assert done.ended_at and done.cancel_initiated_at is None
    lines = _results(client, done, KEY)
    assert sorted(lines) == sorted(r["custom_id"] for r in requests) and _kinds(lines) == {"succeeded": N, "errored": 1}
    assert lines["bad-0"].error.error.type == "invalid_request_error"
    assert all(lines[f"req-{i}"].message.content[0].text for i in range(N))
    assert _kinds(_results(client, _ended(client, second.id), KEY)) == {"succeeded": 5}


def test_a_running_batch_cancelled_keeps_its_finished_results(tmp_path, servers):
    gate = tmp_path / "gate"
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    client, requests = _client(server.port), message_requests(N)
    batch = _create(client, requests)
    server.wait(lambda: _answered(tmp_path / "root", client, batch.id, 10), "a shard answered")
    canceling = conforms(client.messages.batches.with_raw_response.cancel(batch.id).text())
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at and canceling.ended_at is None
    done = _ended(client, batch.id)
    counts = done.request_counts
    assert counts.succeeded >= 10 and counts.canceled >= 1 and counts.expired == 0 and counts.processing == 0
    assert counts.succeeded + counts.errored + counts.canceled == N + 1
    lines = _results(client, done)
    assert sorted(lines) == sorted(r["custom_id"] for r in requests)  # every custom_id once
    kinds = _kinds(lines)
    assert (kinds.get("succeeded", 0), kinds.get("errored", 0), kinds["canceled"]) == (
        counts.succeeded, counts.errored, counts.canceled)
    assert _retrieve(client, batch.id).processing_status == "ended"  # cancelling again changes nothing


@pytest.fixture
def in_process(tmp_path, monkeypatch) -> Iterator[tuple[Any, Any, Path]]:
    """A server in this process, its worker started (runs in children), gated as above: (the
    worker, the anthropic client, the gate)."""
    import uvicorn

    from sparkbatch_dagster.serve.app import make_app
    from sparkbatch_dagster.serve.guard import access
    from sparkbatch_dagster.serve.worker import Store, Worker
    from sparkbatch_dagster.spec import SamplingSpec
    from sparkbatch_dagster.testing import FakeVLLMResource

    gate = tmp_path / "gate"
    (tmp_path / "engine.py").write_text("from sparkbatch_dagster.testing import FakeVLLMResource\n"
                                        f"resource = FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster_home"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    store = Store(tmp_path / "root")
    worker = Worker(store, ["--engine-file", str(tmp_path / "engine.py")],
                    FakeVLLMResource(gate_path=str(gate), gate_after=15), SamplingSpec(max_tokens=256), 10, 0.79)
    worker.start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(store, worker, access("127.0.0.1", None)), host="127.0.0.1",
                                           port=port, lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until("the in-process server to listen", lambda: server.started)
    try:
        yield worker, _client(port), gate
    finally:
        gate.touch()
        server.should_exit = True
        thread.join(60)
        if worker.child is not None and worker.child.poll() is None:
            os.killpg(worker.child.pid, 9)


def test_batches_past_their_window_expire_through_the_clock_hook(tmp_path, in_process):
    worker, client, _ = in_process
    requests = message_requests(N)
    running = _create(client, requests)
    wait_until("a shard answered", lambda: _answered(tmp_path / "root", client, running.id, 10), deadline_s=300)
    queued = _create(client, message_requests(3, "queued", bad=False))
    window = worker.store.batch(queued.id).expires_at
    assert int(running.expires_at.timestamp()) == worker.store.batch(running.id).expires_at
    assert worker.expire_due(at=worker.store.batch(running.id).expires_at - 1) == []  # not yet
    assert set(worker.expire_due(at=window)) == {running.id, queued.id}
    gone = _ended(client, queued.id)  # it never ran: every request expired
    assert gone.request_counts.expired == 3 and gone.cancel_initiated_at is None
    assert _kinds(_results(client, gone)) == {"expired": 3}
    done = _ended(client, running.id)  # its run stopped: its finished rows kept, the rest expired
    counts = done.request_counts
    assert counts.succeeded >= 10 and counts.expired >= 1 and counts.canceled == 0
    assert counts.succeeded + counts.errored + counts.expired == N + 1
    lines = _results(client, done)
    assert sorted(lines) == sorted(r["custom_id"] for r in requests)
    assert _kinds(lines)["expired"] == counts.expired


def test_bad_creates_are_400s_naming_the_request_and_errors_keep_each_apis_shape(tmp_path, servers):
    servers.append(server := Server(tmp_path, "FakeVLLMResource()", api_key=KEY))
    client = _client(server.port, KEY)
    good = message_requests(1, bad=False)[0]
    bad = {"requests.0.custom_id": [{**good, "custom_id": "has space"}],
           "requests.1.custom_id": [good, {**good, "custom_id": "x" * 65}],
           "requests.2.custom_id": [good, {**good, "custom_id": "b"}, {**good, "custom_id": "b"}],
           "requests.0.params.max_tokens": [{**good, "params": {k: v for k, v in good["params"].items()
                                                               if k != "max_tokens"}}],
           "requests.0.params.model": [{**good, "params": {k: v for k, v in good["params"].items() if k != "model"}}],
           "requests.0.params": [{**good, "params": "not an object"}],
           "requests": []}
    for field, requests in bad.items():
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.batches.create(requests=requests)
        body = refused.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["message"].startswith(field + ":"), (field, body)
    assert client.messages.batches.list().data == []  # nothing created
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.batches.retrieve("msgbatch_nope")
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        _client(server.port, "guess").messages.batches.list()
    assert wrong.value.body["error"]["type"] == "authentication_error"
    listed = httpx.get(f"http://127.0.0.1:{server.port}/v1/messages/batches", headers={"x-api-key": KEY})
    assert listed.status_code == 200 and listed.json()["data"] == []  # Anthropic's documented key header
    openai = pytest.importorskip("openai")
    batch = _create(client, [good])
    with pytest.raises(openai.NotFoundError) as other:  # a Message Batch is no OpenAI batch; OpenAI's shape
        server.client.batches.retrieve(batch.id)
    assert other.value.body["code"] == "not_found" and server.client.batches.list().data == []


def test_an_openai_batchs_answers_are_reused_by_an_anthropic_batch(tmp_path, servers):
    trace = tmp_path / "trace.txt"
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(trace_path={str(trace)!r})"))
    # temperature 0: an unseeded sample (both APIs' default temperature is 1) is never reused.
    requests = [{**r, "params": {**r["params"], "temperature": 0}} for r in message_requests(6, bad=False)]
    lines = [json.dumps({"custom_id": r["custom_id"], "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "any", "messages": r["params"]["messages"], "max_tokens": 8,
                                  "temperature": 0}})
             for r in requests]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    upload = server.client.files.create(file=(tmp_path / "in.jsonl").open("rb"), purpose="batch")
    openai_batch = server.batch(server.client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                             completion_window="24h").id, "completed")
    asked = trace.read_text().split()
    assert len(asked) == 6 and openai_batch.request_counts.completed == 6
    client = _client(server.port)
    done = _ended(client, _create(client, requests).id)
    assert trace.read_text().split() == asked  # the engine was not asked again
    answers = {cid: r.message.content[0].text for cid, r in _results(client, done).items()}
    content = server.client.files.content(openai_batch.output_file_id).text.splitlines()
    assert answers == {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"]
                       for x in map(json.loads, content)}
    assert all(r.message.usage.output_tokens == 0 for r in _results(client, done).values())  # none generated


# make soak: the same store and worker resume an OpenAI batch after a kill in make test's gate
# (test_serve_batch.py); here through the Message Batches routes.
@pytest.mark.long
def test_a_killed_server_finishes_its_message_batch_when_started_again(tmp_path, servers):
    gate, trace = tmp_path / "gate", tmp_path / "trace.txt"
    engine = f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15, trace_path={str(trace)!r})"
    servers.append(first := Server(tmp_path, engine))
    requests = message_requests(N)
    batch = _create(_client(first.port), requests)
    first.wait(lambda: _answered(tmp_path / "root", _client(first.port), batch.id, 10), "a shard answered")
    first.kill()
    asked_before = trace.read_text().split()
    gate.touch()
    servers.append(second := Server(tmp_path, engine))
    client = _client(second.port)
    done = _ended(client, batch.id)
    assert done.created_at == batch.created_at and done.request_counts.succeeded == N
    assert sorted(_results(client, done)) == sorted(r["custom_id"] for r in requests)  # every custom_id once
    assert len(trace.read_text().split()) - len(asked_before) <= N - 10  # committed rows not asked again
