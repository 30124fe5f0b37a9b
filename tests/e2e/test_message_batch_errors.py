"""A Message Batch's errored result cites the request and field the ``anthropic`` client sent
(issue 59: it cited "line 2" of the server's own file of the requests): created through the
route, run by the serve-batch worker (its ``run-batch`` child's run done in this process, on the
fake engine), its results parsed with the ``anthropic`` package's own types."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.serve.app import make_app
from sparkbatch_dagster.serve.guard import access
from sparkbatch_dagster.serve.worker import Store, Worker, _job_name
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource


def test_an_errored_result_names_the_request_and_field(tmp_path: Path):
    from anthropic.types.messages import MessageBatchIndividualResponse

    store, resource = Store(tmp_path / "root"), FakeVLLMResource()
    # Never started: this test runs the batch.
    worker = Worker(store, [], resource, SamplingSpec(max_tokens=8), 10, 0.79)
    client = TestClient(make_app(store, worker, access("127.0.0.1", None)), base_url="http://127.0.0.1:8400")
    good = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    prefill = {**good, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]}
    created = client.post("/v1/messages/batches", json={"requests": [{"custom_id": "ok", "params": good},
                                                                     {"custom_id": "bad", "params": prefill}]})
    assert created.status_code == 200, created.text
    bid = created.json()["id"]
    job, defs = batch_file_job(store.file_path(store.batch(bid).input_file_id), "anthropic_batch",
                               home=store.folder(bid) / "home", name=_job_name(bid), resource=resource,
                               sampling=SamplingSpec(max_tokens=8), shard_size=10, result_store=str(worker.answers))
    worker._jobs[bid] = job
    run_batch(job, defs, store.folder(bid) / "output.jsonl", None)
    worker._finish(bid, "completed")
    results = client.get(f"/v1/messages/batches/{bid}/results")
    parsed = [MessageBatchIndividualResponse.model_validate(json.loads(x), strict=True)
              for x in results.text.splitlines()]
    lines = {x.custom_id: x for x in parsed}
    assert lines["ok"].result.type == "succeeded" and lines["bad"].result.type == "errored"
    message = lines["bad"].result.error.error.message  # type: ignore[union-attr]
    assert message.startswith("unsupported: requests.1.params.messages") and "line" not in message, message
