"""Issue 59: every request field declared once (spec/request_fields.py): the job's
``SamplingSpec``, the line parser, the engines' parameters and docs/batch-files.md's table all
follow the declaration; the one merge keeps vLLM's order; a model's generation_config never
overrides the job's value (item 5)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkbatch_dagster.engines.answers.plan import sampling_fields
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.spec.batch_requests import _SAMPLING
from sparkbatch_dagster.spec.request_fields import FIELDS, field_table, line_names, merged

DOCS = Path(__file__).resolve().parents[2] / "docs" / "batch-files.md"


def test_the_docs_table_is_the_declaration() -> None:
    text = DOCS.read_text()
    table = re.search(r"<!-- request-fields:start -->\n(.*?)\n<!-- request-fields:end -->", text, re.S)
    assert table is not None and table.group(1) == field_table()


def test_sampling_spec_and_the_parser_hold_exactly_the_declared_fields() -> None:
    assert {f.name for f in FIELDS} == set(SamplingSpec.model_fields)
    for fmt in ("openai_batch", "anthropic_batch"):
        assert set(_SAMPLING[fmt]) | ({"top_logprobs"} if fmt == "openai_batch" else set()) == set(line_names(fmt))
    engine = {f.name for f in FIELDS if f.engine}
    sent = sampling_fields(SamplingSpec(temperature=0.5, seed=1, stop=("x",), n=2, presence_penalty=0.1,
                                        frequency_penalty=0.1, top_k=3, logit_bias={1: 1.0}))
    assert set(sent) == engine


LAYER = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.none() | st.integers(0, 3), max_size=3)


@given(st.lists(LAYER, min_size=1, max_size=4))
def test_the_merge_takes_each_fields_first_set_layer(layers: list[dict[str, int | None]]) -> None:
    out = merged(*layers)
    for key in {k for layer in layers for k in layer}:
        # The oracle: walk the layers in order, the first that sets the key (not None) decides.
        expected = next((layer[key] for layer in layers if layer.get(key) is not None), None)
        assert out[key] == expected


def test_a_models_generation_config_is_under_the_jobs_value_in_the_servers_body() -> None:
    """Item 5: the server path sent the model's top_k instead of the job's (the offline one, with
    the real SamplingParams, is tests/real/test_model_defaults.py)."""
    from sparkbatch_dagster.engines.answers.plan import plan
    from sparkbatch_dagster.engines.base import EngineRequest
    from sparkbatch_dagster.spec import OutputSpec

    model = {"top_k": 20, "repetition_penalty": 1.05}
    job = SamplingSpec(top_k=4)
    assert sampling_fields(job, defaults=model)["top_k"] == 4
    assert sampling_fields(SamplingSpec(), defaults=model)["top_k"] == 20
    assert sampling_fields(job, defaults=model)["repetition_penalty"] == 1.05
    body = plan(None, job, OutputSpec(), defaults=model, server=True).fields(EngineRequest("r", []), "grammar", False)
    assert (body["top_k"], body["repetition_penalty"]) == (4, 1.05)
    line = EngineRequest("r", [], sampling=SamplingSpec(top_k=7))  # a line's own wins over both
    assert plan(None, job, OutputSpec(), defaults=model, server=True).fields(line, "own", False)["top_k"] == 7
