"""``serve-batch --temperature`` (and ``run-batch``'s): what a batch line that sets no temperature gets.
Without the flag such a line samples at the hosted APIs' 1.0 with no seed (a draw: no answer key, never
reused); with ``--temperature 0`` it is greedy and reusable, in the server's own job and in the
``run-batch`` child it starts, which gets the same flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkbatch_dagster.cli.batch import _sampling
from sparkbatch_dagster.cli.entry import _parser
from sparkbatch_dagster.serve.worker import Store, Worker
from sparkbatch_dagster.spec import OutputSpec
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.spec.batch_requests import parse_line
from sparkbatch_dagster.testing import FakeVLLMResource

LINE = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]}}


def _worker(tmp_path: Path, argv: list[str]) -> Worker:
    args = _parser().parse_args(["serve-batch", "--root", str(tmp_path), *argv])
    return Worker(Store(tmp_path), [], FakeVLLMResource(), _sampling(args), args.shard_size, args.hourly_rate)


def _key(worker: Worker) -> str | None:
    line = parse_line(json.loads(json.dumps(LINE)), "openai_batch", worker.sampling)
    return request_prompt(line.request.to_text(), worker.sampling).answer_key(worker.sampling, OutputSpec())


def test_without_the_flag_a_line_without_temperature_is_a_draw(tmp_path: Path):
    worker = _worker(tmp_path, [])
    assert "--temperature" not in worker.options
    assert _key(worker) is None  # sampled at 1.0, no seed: generated every time


@pytest.mark.parametrize("given", ["0", "0.0"])
def test_the_flag_makes_such_a_line_greedy_and_reusable_in_the_server_and_its_child(tmp_path: Path, given: str):
    worker = _worker(tmp_path, ["--temperature", given, "--max-tokens", "12"])
    at = worker.options.index("--temperature")
    assert float(worker.options[at + 1]) == 0.0
    assert worker.options[worker.options.index("--max-tokens") + 1] == "12"
    assert worker.sampling.temperature == 0.0 and worker.sampling.max_tokens == 12
    key = _key(worker)
    assert key is not None and key == _key(_worker(tmp_path, ["--temperature", given, "--max-tokens", "12"]))


def test_run_batch_takes_the_same_flag():
    args = _parser().parse_args(["run-batch", "-i", "in.jsonl", "-o", "out.jsonl", "--temperature", "0.3"])
    assert _sampling(args).temperature == 0.3 and "temperature" in _sampling(args).model_fields_set
