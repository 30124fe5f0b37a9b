"""benchmarks/lib/switches.py: the measurement-only switches, which live with the benchmarks and
reach the engine's modules only inside their ``with`` block."""

import asyncio
import gc
import types

import pytest

from benchmarks.lib import switches
from sparkbatch_dagster import OutputSpec, SamplingSpec
from sparkbatch_dagster.engines.answers.plan import plan
from sparkbatch_dagster.engines.config import EngineSettings
from sparkbatch_dagster.engines.offline import vllm_offline
from sparkbatch_dagster.engines.platform import heap
from sparkbatch_dagster.engines.server import vllm_server

LABEL = OutputSpec(kind="label", labels=["positive", "negative", "neutral"])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.platform.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(None))


def test_confidence_and_the_label_routing_switch_only_inside_their_block(tokenizer):
    with switches.no_confidence(), switches.label_routing(probe=4, bar=1.0):
        inside = plan(tokenizer, SamplingSpec(max_tokens=8), LABEL)
    outside = plan(tokenizer, SamplingSpec(max_tokens=8), LABEL)
    assert inside.scorer is None and inside.tally is not None and (inside.tally.probe, inside.tally.max_asked_again) \
        == (4, 1.0)
    assert outside.scorer is not None and outside.tally is not None and outside.tally.probe == 32


def test_thawed_leaves_the_heap_as_it_is_while_the_collector_runs():
    with switches.thawed(), heap.frozen_heap():
        assert gc.get_freeze_count() == 0 and not heap.is_frozen() and gc.isenabled()
    with heap.frozen_heap():
        assert heap.is_frozen()


def test_encoding_inline_and_handoff_unbatched():
    loop = asyncio.new_event_loop()
    try:
        with switches.inline_encoding(), switches.unbatched_handoff():
            assert vllm_offline.EncodeAhead(lambda batch: batch).depth == 1  # no thread: one chunk a step
            assert not vllm_server.Handoff(loop).batched
        assert vllm_offline.EncodeAhead(lambda batch: batch).depth == 2 and vllm_server.Handoff(loop).batched
    finally:
        loop.close()


def test_engine_switches_set_settings_and_attributes_for_the_block():
    engine = types.SimpleNamespace(settings=EngineSettings(), native_budget=True)
    with switches.engine_switches(engine, {"label_decoding": "grammar", "native_budget": False, "label_bar": 1.0}):
        assert engine.settings.label_decoding == "grammar" and engine.native_budget is False
    assert engine.settings.label_decoding == "auto" and engine.native_budget is True
