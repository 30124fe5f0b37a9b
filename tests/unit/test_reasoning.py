"""Reasoning jobs on the fake engine and real tokenizers: the settings, the parsing paths (no end
marker, a marker in the answer, empty thinking, a budget cut), the reasoning column kept or not,
and a reused answer keeping its thinking. The mechanics on real vLLM: test_reasoning_real.py."""

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster import ConfigError, OutputSpec
from sparkbatch_dagster.engines import FakeEngine
from sparkbatch_dagster.engines.answers import reasoning
from sparkbatch_dagster.run.result_store import ResultStore, prompt_key
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import label_shard
from testkit import LABELS, make_rows, one_shard

MARKS = reasoning.Markers("<think>", "</think>")
THINKING = SamplingSpec(reasoning=16, max_tokens=40)


def _run(tmp_path: Path, engine: FakeEngine, version: str = "00000000000000a1", kind: str = "label", keep: bool = True,
         sampling: SamplingSpec = THINKING, rows: int = 14) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    output = OutputSpec(kind="label", labels=LABELS, keep_reasoning=keep) if kind == "label" else \
        OutputSpec(kind="text", keep_reasoning=keep)
    spec, home = one_shard(tmp_path, make_rows(rows), sampling=sampling, output=output)
    stats = label_shard(spec, home, version, "shard-00000", engine)
    return stats, sorted(pq.read_table(home.labeled_path(version, "shard-00000")).to_pylist(),
                         key=lambda r: r["row_id"])


def test_split_text_paths() -> None:
    assert reasoning.split_text("<think>\nhmm, a fruit</think>\n\nfruit", MARKS) == ("hmm, a fruit", "fruit")
    assert reasoning.split_text("hmm</think>fruit", MARKS) == ("hmm", "fruit")  # the prompt opened it
    assert reasoning.split_text("<think></think>fruit", MARKS) == ("", "fruit")  # empty thinking
    assert reasoning.split_text("<think>still thinking", MARKS) == ("still thinking", None)  # never ended
    # The thinking ends at the first marker: a second one is the answer's text.
    assert reasoning.split_text("a</think>fruit</think>", MARKS) == ("a", "fruit</think>")
    assert reasoning.split_ids([5, 6, 9, 7], reasoning.Markers("<think>", "</think>", 8, 9)) == 3
    assert reasoning.split_ids([5, 6], reasoning.Markers("<think>", "</think>", 8, 9)) is None


def test_settings_checks_and_identity() -> None:
    with pytest.raises(ValueError, match=r"max_tokens=64 cannot hold the thinking budget reasoning=100.*at least 102"):
        SamplingSpec(reasoning=100)
    with pytest.raises(ValueError, match="at least 1 token"):
        SamplingSpec(reasoning=0, max_tokens=10)
    # Off (the default) leaves the output version of every job written before reasoning existed as it was.
    assert "reasoning" not in SamplingSpec().identity() and "keep_reasoning" not in OutputSpec().identity()
    assert SamplingSpec(reasoning="auto").identity()["reasoning"] == "auto"
    assert OutputSpec(keep_reasoning=True).identity()["keep_reasoning"] is True


def test_answers_are_parsed_after_the_thinking(tmp_path: Path) -> None:
    stats, rows = _run(tmp_path, FakeEngine(thinking="it has wheels so"))
    assert stats.errors == 0 and all(r["output"] in LABELS for r in rows)
    fresh = [r for r in rows if not r["deduplicated"]]
    # Four words and the two markers; the answer one word more: output_tokens counts both.
    assert all(r["reasoning"] == "it has wheels so" and r["reasoning_tokens"] == 6 and r["output_tokens"] == 7
               for r in fresh)
    assert stats.reasoning_tokens == 6 * len(fresh) and stats.output_tokens == 7 * len(fresh)


def test_reasoning_not_kept_is_still_counted(tmp_path: Path) -> None:
    stats, rows = _run(tmp_path, FakeEngine(thinking="it has wheels so"), keep=False)
    assert all(r["reasoning"] is None for r in rows)
    assert stats.reasoning_tokens == sum(r["reasoning_tokens"] for r in rows) > 0


def test_budget_cuts_the_thinking(tmp_path: Path) -> None:
    stats, rows = _run(tmp_path, FakeEngine(thinking="one two three four five"),
                       sampling=SamplingSpec(reasoning=2, max_tokens=10))
    assert stats.errors == 0 and all(r["output"] in LABELS for r in rows)
    assert {r["reasoning"] for r in rows} == {"one two"} and max(r["reasoning_tokens"] for r in rows) == 4


def test_empty_thinking_no_end_marker_and_marker_in_the_answer(tmp_path: Path) -> None:
    _, rows = _run(tmp_path / "a", FakeEngine(thinking="x", answer="<think></think>\n\nfruit"))
    assert {(r["output"], r["reasoning"]) for r in rows} == {("fruit", "")}
    _, rows = _run(tmp_path / "b", FakeEngine(thinking="x", answer="<think>and then and then"))
    assert all(r["output"] is None and r["error"].startswith("reasoning_unfinished") for r in rows)
    assert {r["reasoning"] for r in rows} == {"and then and then"}  # kept: why it never answered
    _, rows = _run(tmp_path / "c", FakeEngine(thinking="x", answer="<think>hm</think>fruit</think>"))
    assert all(r["error"].startswith("bad_output") for r in rows)  # a label job: not a label
    _, rows = _run(tmp_path / "d", FakeEngine(thinking="x", answer="<think>hm</think>fruit</think>"), kind="text")
    assert {(r["output"], r["reasoning"]) for r in rows} == {("fruit</think>", "hm")}


def test_reasoning_off_leaves_the_text_alone(tmp_path: Path) -> None:
    _, rows = _run(tmp_path, FakeEngine(thinking="x", answer="<think>hm</think>fruit"), kind="text",
                   sampling=SamplingSpec())
    assert {(r["output"], r["reasoning"], r["reasoning_tokens"]) for r in rows} == {("<think>hm</think>fruit", None, 0)}


def test_a_budget_on_a_model_that_does_not_think_stops_early(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not think"):
        _run(tmp_path, FakeEngine())
    _, rows = _run(tmp_path / "auto", FakeEngine(), sampling=SamplingSpec(reasoning="auto"))  # auto: off here
    assert all(r["output"] in LABELS and r["reasoning_tokens"] == 0 for r in rows)


def test_a_reused_answer_keeps_its_thinking(tmp_path: Path) -> None:
    _run(tmp_path, FakeEngine(thinking="it has wheels so"))
    again = FakeEngine(thinking="something else entirely")
    stats, rows = _run(tmp_path, again, version="00000000000000a2")  # another version, the same stored answers
    assert again.requests_seen == 0 and all(r["reused"] for r in rows)
    assert {r["reasoning"] for r in rows} == {"it has wheels so"}
    assert stats.reasoning_tokens == 0  # nothing generated, nothing spent


def test_store_segments_written_before_reasoning_read_null(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results", "ctx")
    key = prompt_key("s", "u")
    store.dir.mkdir(parents=True)
    k1, k2 = (int.from_bytes(bytes.fromhex(key)[i:i + 8], "big", signed=True) for i in (0, 8))
    old = pa.table({"k1": [k1], "k2": [k2], "output": ["fruit"], "error": pa.array([None], pa.string()),
                    "prompt_tokens": [3], "output_tokens": [1], "model": ["m"], "created_at": ["2026-11-01"],
                    "confidence": [0.9]})  # as an older release wrote it: no reasoning column
    pq.write_table(old, store.dir / "seg-L0-old.parquet")
    assert store.lookup([key]) == {key: ("fruit", None, 0.9, "m", None, None, None, None)}


def test_plan_from_real_templates(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.platform.model import DEFAULT_MODEL_NAME, ensure_embedded
    from sparkbatch_dagster.testing import reasoning_model

    thinker = AutoTokenizer.from_pretrained(reasoning_model(tmp_path / "r"))
    plain = AutoTokenizer.from_pretrained(ensure_embedded(DEFAULT_MODEL_NAME))
    plan = reasoning.plan(thinker, SamplingSpec(reasoning="auto", max_tokens=1100))
    assert plan is not None and plan.budget == reasoning.AUTO_BUDGET
    assert plan.template_kwargs == {"enable_thinking": True}
    assert plan.markers.end_id == thinker.convert_tokens_to_ids("</think>")
    assert reasoning.thinks_by_default(thinker) and not reasoning.thinks_by_default(plain)
    with pytest.raises(ConfigError, match="max_tokens=64 cannot hold the thinking budget"):
        reasoning.plan(thinker, SamplingSpec(reasoning="auto"))  # auto on a thinking template: 1024 tokens
    assert reasoning.plan(plain, SamplingSpec(reasoning="auto")) is None  # SmolLM2 does not think
    with pytest.raises(ConfigError, match="names no thinking markers"):
        reasoning.plan(plain, THINKING)
    assert reasoning.plan(thinker, SamplingSpec()) is None


def test_preview_warns_when_max_tokens_cannot_hold_the_thinking(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from sparkbatch_dagster.cli.preview import reasoning_warnings
    from sparkbatch_dagster.testing import reasoning_model
    from testkit import make_spec

    thinker = AutoTokenizer.from_pretrained(reasoning_model(tmp_path / "r"))
    spec = make_spec(tmp_path)
    [off] = reasoning_warnings(spec, thinker)  # thinks by default, reasoning off
    assert "thinks by default" in off and "sampling.reasoning to 'auto'" in off and "at least 1026" in off
    [auto] = reasoning_warnings(spec.model_copy(update={"sampling": SamplingSpec(reasoning="auto")}), thinker)
    assert "max_tokens=64 cannot hold the thinking budget (1024" in auto
    # A budget leaving one token for a label of several: the longest label's tokens name the fix.
    long_label = "a fruit of the vine"
    tight = spec.model_copy(update={"sampling": SamplingSpec(reasoning=16, max_tokens=18),
                                    "output": OutputSpec(kind="label", labels=[long_label, "vehicle"])})
    longest = len(thinker(long_label, add_special_tokens=False)["input_ids"])
    [warned] = reasoning_warnings(tight, thinker)
    assert longest > 1 and f"raise sampling.max_tokens to {17 + longest}" in warned
    roomy = spec.model_copy(update={"sampling": SamplingSpec(reasoning=16, max_tokens=40)})
    assert reasoning_warnings(roomy, thinker) == []
    assert reasoning_warnings(spec, None) == []  # no tokenizer here: nothing to say


def test_server_answers_with_the_thinking_apart_or_inline() -> None:
    from sparkbatch_dagster.engines.answers import reasoning
    from sparkbatch_dagster.engines.server.reasoning_server import reasoned_result

    plan = reasoning.plan(None, THINKING)  # a chat server's: its template stays there
    assert plan is not None and reasoning.request_fields(plan) == {"thinking_token_budget": 16,
                                                                   "chat_template_kwargs": {"enable_thinking": True}}
    with pytest.raises(ConfigError, match="server_token_ids=True"):
        reasoning.plan(None, SamplingSpec(reasoning="auto", max_tokens=2000))
    usage = {"prompt_tokens": 9, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 10}}
    # A server run with --reasoning-parser: the thinking comes apart from the answer.
    apart = {"message": {"content": "\n\nfruit", "reasoning": "round, sweet"}, "finish_reason": "stop"}
    res = reasoned_result("r1", "\n\nfruit", apart, usage, plan, None)
    assert (res.text, res.reasoning, res.reasoning_tokens, res.output_tokens) == ("fruit", "round, sweet", 10, 12)
    # Inline (no parser on the server): split here; no count from the server, none without a tokenizer.
    inline = {"message": {"content": "<think>round</think>\n\nfruit"}, "finish_reason": "stop"}
    res = reasoned_result("r2", inline["message"]["content"], inline, {"completion_tokens": 5}, plan, None)
    assert (res.text, res.reasoning, res.reasoning_tokens) == ("fruit", "round", 0)
    cut = {"message": {"content": "<think>round and"}, "finish_reason": "length"}
    res = reasoned_result("r3", "<think>round and", cut, {"completion_tokens": 40}, plan, None)
    assert res.text is None and res.error.startswith("reasoning_unfinished") and res.reasoning == "round and"


@pytest.mark.parametrize("value", ["auto", 256])
def test_a_defs_yaml_sets_the_reasoning(tmp_path: Path, value: object) -> None:
    from testkit import label_defs_yaml, yaml_job_spec

    text = label_defs_yaml(tmp_path, f"""\
        sampling: {{reasoning: {value}, max_tokens: 1200}}
    """, ", keep_reasoning: true")
    spec = yaml_job_spec(text)
    assert spec.sampling.reasoning == value and spec.output.keep_reasoning


def test_a_parser_engine_refuses_a_grammar_that_would_wait_for_the_thinking(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.offline.reasoning_offline import check_unbounded
    from sparkbatch_dagster.engines.platform.model import DEFAULT_MODEL_NAME, ensure_embedded
    from sparkbatch_dagster.testing import reasoning_model

    thinker = AutoTokenizer.from_pretrained(reasoning_model(tmp_path / "r"))
    with pytest.raises(ConfigError, match="started with a reasoning parser.*engine_kwargs.reasoning_parser"):
        check_unbounded(thinker, SamplingSpec(), OutputSpec(kind="label", labels=LABELS))
    check_unbounded(thinker, SamplingSpec(), OutputSpec(kind="text"))  # no grammar: nothing waits
    plain = AutoTokenizer.from_pretrained(ensure_embedded(DEFAULT_MODEL_NAME))
    check_unbounded(plain, SamplingSpec(), OutputSpec(kind="label", labels=LABELS))  # a model that does not think
