"""OpenAI's Batch semantics, end to end: the result files' ``usage`` adds up to the tokens the run
generated (a request answered by an identical one, in its shard or another, reports none), and
``sparkbatch serve-batch`` gives the Batch object its ``usage`` and ``model`` and serves
``files.list`` / ``files.delete`` to the unchanged ``openai`` client, every object parsed with
the client's own types. The in-process half is tests/unit/test_batch_semantics.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.test_serve_batch import Server
from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.testing import FakeVLLMResource

openai = pytest.importorskip("openai")
URL = "/v1/chat/completions"


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def _line(cid: str, content: str) -> str:
    # temperature 0: a line without one is a sample at the APIs' 1.0, never shared nor reused.
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL,
                       "body": {"model": "gpt-x", "messages": [{"role": "user", "content": content}],
                                "max_tokens": 8, "temperature": 0}})


# The same prompt in every shard of 2 (and twice in the last): answered once, reused elsewhere.
LINES = [_line("same-1", "the same question"), _line("b", "another question"), _line("same-2", "the same question"),
         _line("c", "a third question"), _line("same-3", "the same question"), _line("same-4", "the same question")]


def _usage_sums(path: Path) -> tuple[int, int]:
    from openai.types.chat import ChatCompletion

    bodies = [ChatCompletion.model_validate(json.loads(x)["response"]["body"]) for x in path.read_text().splitlines()]
    return (sum(b.usage.prompt_tokens for b in bodies if b.usage), sum(b.usage.completion_tokens for b in bodies
                                                                       if b.usage))


def test_the_files_usage_adds_up_to_the_generated_tokens(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("\n".join(LINES) + "\n")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True, answer="one two three"),
                               shard_size=2)
    summary = run_batch(job, defs, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert summary["rows"] == len(LINES) and summary["errors"] == 0 and summary["input_tokens"] > 0
    assert _usage_sums(tmp_path / "out.jsonl") == (summary["input_tokens"], summary["output_tokens"])
    export = summary["export"]
    assert (export["input_tokens"], export["output_tokens"]) == (summary["input_tokens"], summary["output_tokens"])
    assert export["model"].startswith("fake-model")  # the answering model's identity
    # Four lines of one prompt: one generation per shard at most (shards may run side by side,
    # each before the other's answer is stored), the other lines answered from it.
    assert 1 <= export["reused"] <= 3


def test_the_batch_has_usage_and_model_and_files_list_and_delete(tmp_path: Path, servers: list[Server]) -> None:
    (tmp_path / "in.jsonl").write_text("\n".join(LINES) + "\n")
    servers.append(server := Server(tmp_path, "FakeVLLMResource()"))
    client = server.client
    uploaded = client.files.create(file=(tmp_path / "in.jsonl").open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=URL, completion_window="24h")
    assert batch.usage is None and batch.model is None
    done = server.batch(batch.id, "completed")
    out = tmp_path / "downloaded.jsonl"
    out.write_text(client.files.content(done.output_file_id).text)
    assert done.usage is not None and done.model == "fake-model" and done.model_extra["reused_requests"] == 3
    assert (done.usage.input_tokens, done.usage.output_tokens) == _usage_sums(out)
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0

    listed = client.files.list()  # newest first: the result file, then the upload
    assert [f.id for f in listed.data] == [done.output_file_id, uploaded.id]
    assert [f.id for f in client.files.list(purpose="batch").data] == [uploaded.id]
    assert [f.id for f in client.files.list(order="asc", limit=1).data] == [uploaded.id]
    for f in client.files.list():  # cleanup code, as against OpenAI (the client follows the pages)
        assert client.files.delete(f.id).deleted
    assert client.files.list().data == []
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(uploaded.id)


def test_a_bad_file_fails_validation_and_a_queued_batch_is_in_progress(tmp_path: Path, servers: list[Server]) -> None:
    from e2e.test_serve_batch import N, _requests

    gate = tmp_path / "gate"
    _requests(tmp_path / "requests.jsonl")
    bad = [_line("a", "x"), "{not json", _line("a", "again"),
           json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})]
    (tmp_path / "bad.jsonl").write_text("\n".join(bad) + "\n")
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    client = server.client
    good = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    first = client.batches.create(input_file_id=good.id, endpoint=URL, completion_window="24h")
    server.batch(first.id, "in_progress", least=10)  # running, held at the engine's gate
    queued = client.batches.create(input_file_id=good.id, endpoint=URL, completion_window="24h")
    waiting = server.batch(queued.id, "in_progress")  # validated: in progress, as OpenAI's, though not run yet
    assert waiting.in_progress_at and waiting.request_counts.completed == 0
    assert client.batches.retrieve(first.id).request_counts.completed < N
    upload = client.files.create(file=(tmp_path / "bad.jsonl").open("rb"), purpose="batch")
    failed = server.batch(client.batches.create(input_file_id=upload.id, endpoint=URL, completion_window="24h").id,
                          "failed")
    assert failed.errors is not None and failed.in_progress_at is None and failed.output_file_id is None
    assert [(e.line, e.code) for e in failed.errors.data] == [(2, "invalid_json_line"), (3, "duplicate_custom_id"),
                                                              (4, "url_mismatch")]
    gate.touch()
    done = server.batch(queued.id, "completed")
    assert done.in_progress_at == waiting.in_progress_at and done.finalizing_at and done.completed_at


def test_a_resubmitted_file_is_answered_from_the_servers_answer_store(tmp_path: Path, servers: list[Server]) -> None:
    from e2e.test_serve_batch import N, _requests, _results

    trace = tmp_path / "trace.txt"
    _requests(tmp_path / "requests.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for line in lines:  # temperature 0 where unset: a sample (the APIs' default 1.0) is never reused
        line["body"].setdefault("temperature", 0)
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(trace_path={str(trace)!r})"))
    client = server.client

    def run_once() -> Any:
        upload = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
        return server.batch(client.batches.create(input_file_id=upload.id, endpoint=URL, completion_window="24h").id,
                            "completed")

    first = run_once()
    asked = trace.read_text().split()
    assert len(asked) == N and first.usage is not None and first.usage.output_tokens > 0
    again = run_once()  # another batch, another upload of the same requests
    assert trace.read_text().split() == asked  # nothing asked of the engine again
    assert again.model_extra["reused_requests"] == N and again.request_counts.completed == N
    assert again.usage is not None and again.usage.total_tokens == 0 and again.model == first.model
    answers = {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"]
               for x in _results(client, again)[0]}
    assert answers == {x["custom_id"]: x["response"]["body"]["choices"][0]["message"]["content"]
                       for x in _results(client, first)[0]}
