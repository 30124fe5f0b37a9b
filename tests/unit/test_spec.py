import pytest

from sparkbatch_dagster import ConfigError, JobSpec, OutputSpec

BASE = dict(name="job", input="x.parquet", text_columns=["text"], user_template="{{ text }}")


def test_valid_spec_has_defaults():
    spec = JobSpec(**BASE)
    assert spec.hourly_rate_usd == 0.79
    assert spec.shards_for(25_000) == 3  # default shard size 10k


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"name": "Bad Name"}, "name='Bad Name'"),
        ({"user_template": "{{ body }}"}, "['body'], which are not in text_columns"),
        ({"user_template": "{{ text "}, "does not parse"),
        ({"text_columns": []}, "text_columns is empty"),
        ({"shard_count": 2, "shard_size": 10}, "not both"),
        ({"hourly_rate_usd": -1}, "JobSpec.hourly_rate_usd"),
        ({"output": {"kind": "label", "labels": ["a"]}}, "at least two labels"),
        ({"output": {"kind": "json"}}, "needs output.json_schema"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_bad_config_names_the_value(change, needle):
    with pytest.raises(ConfigError) as err:
        JobSpec(**{**BASE, **change})
    assert needle in str(err.value)


def test_confidence_off_keeps_the_output_version_and_the_stored_answers():
    """Turning the confidence off changes no answer: the same version, the same result store."""
    out = {"kind": "label", "labels": ["a", "b"]}
    on, off = JobSpec(**BASE, output=out), JobSpec(**BASE, output={**out, "confidence": False})
    assert on.prompt_fingerprint() == off.prompt_fingerprint()
    assert on.answer_context("m") == off.answer_context("m")
    # Fixed values: a field added to OutputSpec later must not move every job's version either.
    assert on.prompt_fingerprint() == "28064e2df273d3f7" and on.answer_context("m") == "63568497b80b0e87"


def test_fingerprint_changes_with_prompt_and_sampling():
    a = JobSpec(**BASE)
    assert a.prompt_fingerprint() == JobSpec(**BASE).prompt_fingerprint()
    assert a.prompt_fingerprint() != JobSpec(**{**BASE, "user_template": "Q: {{ text }}"}).prompt_fingerprint()
    assert a.prompt_fingerprint() != JobSpec(**BASE, sampling={"max_tokens": 5}).prompt_fingerprint()
    assert a.prompt_fingerprint() != JobSpec(
        **BASE, output=OutputSpec(kind="label", labels=["x", "y"])
    ).prompt_fingerprint()


def test_the_docs_list_every_jobspec_field_with_its_default():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "job-spec.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", readme, flags=re.M))
    assert set(JobSpec.model_fields) <= set(rows), set(JobSpec.model_fields) - set(rows)
    for name, field in JobSpec.model_fields.items():
        if field.is_required():
            assert rows[name].strip() == "required", name
        elif field.default_factory is None:
            assert rows[name].strip() == f"`{field.default!r}`".replace("'", '"'), name
