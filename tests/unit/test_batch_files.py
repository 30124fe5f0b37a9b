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
from sparkbatch_dagster.spec.batch_requests import request_prompt
from sparkbatch_dagster.spec.prompts import RenderedPrompt
from sparkbatch_dagster.testing import FakeVLLMResource


def test_a_plain_request_is_the_column_paths_prompt() -> None:
    """system + user with no settings of its own: the same result-store key as the template's prompt."""
    from sparkbatch_dagster.spec import SamplingSpec

    request = json.dumps({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                          "sampling": {}, "output": None})
    assert request_prompt(request, SamplingSpec()).key == RenderedPrompt("S", "U").key


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
