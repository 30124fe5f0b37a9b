"""Provider batch files (docs/batch-files.md) with the fake engine: hostile lines, each line's
own sampling and output, the exported files parsed with the ``openai`` and ``anthropic``
packages' own models, every line exactly once across the output and error files, a partial
export after a failed run, and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkbatch_dagster import JobSpec
from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.errors import ConfigError, InputError
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.spec.prompts import RenderedPrompt
from sparkbatch_dagster.testing import FakeVLLMResource


def test_a_plain_request_is_the_column_paths_prompt() -> None:
    """system + user with no settings of its own: the same result-store key as the template's prompt;
    a line at temperature 0 whose job leaves the seed at 0 too (greedy decoding reads no seed)."""
    from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
    from sparkbatch_dagster.spec.batch_requests import parse_line

    job, out = SamplingSpec(), OutputSpec()
    request = json.dumps({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                          "sampling": {}, "output": None})
    assert request_prompt(request, job).answer_key(job, out) == RenderedPrompt("S", "U").answer_key(job, out)
    line = parse_line({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "temperature": 0,
        "max_tokens": 64}}, "openai_batch", job)
    assert line.request.sampling == {"seed": None}
    assert request_prompt(line.request.to_text(), job).answer_key(job, out) == \
        RenderedPrompt("S", "U").answer_key(job, out)


def test_bad_files_and_specs_stop_early(tmp_path: Path) -> None:
    (tmp_path / "notes.jsonl").write_text("just some text\nmore text\n")
    job, defs = batch_file_job(tmp_path / "notes.jsonl", "openai_batch", resource=FakeVLLMResource(keep_warm=True))
    with pytest.raises(InputError, match="not a openai_batch file"):
        from sparkbatch_dagster.inputs.shards import build_shards

        build_shards(job.spec, job.home)
    with pytest.raises(InputError, match="--format"):
        batch_file_job(tmp_path / "notes.jsonl")
    with pytest.raises(ConfigError, match="sets text_columns itself"):
        JobSpec(name="b", input="x.jsonl", input_format="openai_batch", text_columns=["t"], user_template="{{ t }}")
    with pytest.raises(ConfigError, match="leave output"):
        JobSpec(name="b", input="x.jsonl", input_format="openai_batch", output={"kind": "label", "labels": ["a", "b"]})
    with pytest.raises(ConfigError, match="reasoning 'off'"):
        JobSpec(name="b", input="x.jsonl", input_format="openai_batch", sampling={"reasoning": 256, "max_tokens": 512})
    spec = JobSpec(name="b", input="x.jsonl", input_format="anthropic_batch")
    assert (spec.id_column, spec.text_columns) == ("custom_id", ["request"])


def test_a_defs_yaml_reads_a_batch_file() -> None:
    from testkit import yaml_job_spec

    spec = yaml_job_spec('type: sparkbatch_dagster.BatchInferenceComponent\nattributes:\n  name: things\n'
                         '  input: /data/requests.jsonl\n  input_format: openai_batch\n'
                         '  text_columns: [request]\n  user_template: "{{ request }}"\n')
    assert (spec.input_format, spec.id_column, spec.max_input_chars) == ("openai_batch", "custom_id", 1_000_000)


def test_a_line_parses_to_a_typed_record_whose_canonical_text_is_unchanged() -> None:
    """The staged ``request`` text is the row's request as parsed: a typed record's canonical JSON."""
    from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
    from sparkbatch_dagster.spec.batch_requests import BatchRequest, JsonOutput, Message, parse_line

    body = {"messages": [{"role": "developer", "content": "Sé"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 7, "seed": 3,
        "response_format": {"type": "json_object"}, "model": "ignored", "n": 1}
    url = "/v1/chat/completions"
    line = parse_line({"custom_id": "q1", "method": "POST", "url": url, "body": body}, "openai_batch",
                      SamplingSpec(max_tokens=256))
    assert (line.custom_id, line.provider, line.url, line.params) == ("q1", "openai_batch", url, body)
    assert line.request == BatchRequest(messages=[Message("system", "Sé"), Message("user", "a\nb")],
                                        sampling={"max_tokens": 7, "seed": 3, "temperature": 1.0},
                                        output=JsonOutput("json", {"type": "object"}))
    text = line.request.to_text()
    assert text == ('{"messages":[{"content":"Sé","role":"system"},{"content":"a\\nb","role":"user"}],'
                    '"output":{"json_schema":{"type":"object"},"kind":"json"},"sampling":{"max_tokens":7,"seed":3,'
                    '"temperature":1.0}}')
    assert BatchRequest.from_text(text) == line.request
    prompt = request_prompt(text, SamplingSpec(max_tokens=256))
    assert prompt.sampling is not None and prompt.sampling.max_tokens == 7 and prompt.output is not None
    claude = parse_line({"custom_id": "c1", "params": {"max_tokens": 5, "system": "S", "messages": [
        {"role": "user", "content": "U"}], "temperature": 0}}, "anthropic_batch", SamplingSpec(max_tokens=5))
    assert (claude.provider, claude.url, claude.request.sampling) == ("anthropic_batch", None, {"seed": None})
    job, out = SamplingSpec(max_tokens=5), OutputSpec()
    assert request_prompt(claude.request.to_text(), job).answer_key(job, out) == \
        RenderedPrompt("S", "U").answer_key(job, out)


def test_the_export_summary_prints_as_one_flat_object_in_its_order() -> None:
    from sparkbatch_dagster.run.batch_export import ExportSummary, Tally, usage_of

    tally = Tally(written=1, errors=1, remaining=0, rows=2, complete=True)
    rows = [{"prompt_tokens": 4, "output_tokens": 2, "cached_tokens": None, "reasoning_tokens": 1, "error": None,
             "reused": False, "deduplicated": False, "model": "m"},
            {"prompt_tokens": None, "output_tokens": None, "error": "bad_request: x", "reused": False,
             "deduplicated": False, "model": ""}]
    summary = ExportSummary(tally=tally, usage=usage_of(rows), output_file="o.jsonl", error_file="e.jsonl")
    assert (summary.written, summary.errors, summary.remaining, summary.complete) == (1, 1, 0, True)
    assert summary.to_json() == {"written": 1, "errors": 1, "remaining": 0, "rows": 2, "complete": True,
                                 "input_tokens": 4, "output_tokens": 2, "cached_tokens": 0, "reasoning_tokens": 1,
                                 "reused": 0, "model": "m", "output_file": "o.jsonl", "error_file": "e.jsonl"}
    assert list(summary.to_json()) == ["written", "errors", "remaining", "rows", "complete", "input_tokens",
                                       "output_tokens", "cached_tokens", "reasoning_tokens", "reused", "model",
                                       "output_file", "error_file"]
