"""Issue 59 item 2: a draw is a draw. A request at a temperature above 0 with no seed is generated
every time: never one generation for identical lines, never looked up in the result store, never
stored; with a seed it is an answer like a greedy one. A line without ``temperature`` samples at
the hosted APIs' 1.0 unless the job sets its own; a column job keeps its explicit 0 (and reuse)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkbatch_dagster.engines.base import EngineResult
from sparkbatch_dagster.run.open_shard import new_answers
from sparkbatch_dagster.run.rows import Answer, plan_rows, row, store_key
from sparkbatch_dagster.spec import JobSpec, SamplingSpec
from sparkbatch_dagster.spec.batch_requests import parse_line


def batch_rows(spec: JobSpec, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Staged rows of an OpenAI batch file whose lines have these bodies (as input_shards stages them)."""
    out = []
    for i, body in enumerate(bodies):
        line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "Tell me a joke."}], **body}}
        out.append({"row_id": f"r{i}", "request": parse_line(line, "openai_batch", spec.sampling).request.to_text()})
    return out


def groups_of(spec: JobSpec, bodies: list[dict[str, Any]]) -> dict[str, tuple[Any, list[str]]]:
    errors, groups = plan_rows(spec, batch_rows(spec, bodies), set())
    assert errors == {}
    return groups


def batch_spec(**sampling: Any) -> JobSpec:
    return JobSpec(name="b", input="x.jsonl", input_format="openai_batch", sampling=SamplingSpec(**sampling))


def test_identical_sampled_lines_are_as_many_generations_and_seeded_ones_one() -> None:
    spec = batch_spec()
    draws = groups_of(spec, [{"temperature": 1.0}] * 3)
    assert len(draws) == 3 and all(store_key(g) is None for g in draws)
    unset = groups_of(spec, [{}] * 3)  # no temperature: the APIs' 1.0, no seed: three draws
    assert len(unset) == 3 and all(p.sampling.temperature == 1.0 for p, _ in unset.values())
    seeded = groups_of(spec, [{"temperature": 1.0, "seed": 7}] * 3)
    assert [len(ids) for _, ids in seeded.values()] == [3] and store_key(next(iter(seeded))) is not None
    greedy = groups_of(spec, [{"temperature": 0}] * 3)
    assert [len(ids) for _, ids in greedy.values()] == [3]


def test_a_line_without_temperature_takes_the_jobs_when_the_job_sets_one() -> None:
    for job, expected in ((batch_spec(temperature=0.0), 0.0), (batch_spec(temperature=0.4, seed=3), 0.4)):
        groups = groups_of(job, [{}] * 2)
        assert len(groups) == 1  # greedy, or seeded by the job: one answer for both
        prompt, _ = next(iter(groups.values()))
        assert (prompt.sampling or job.sampling).temperature == expected
    assert batch_spec().sampling.temperature == 0.0  # the job's own default is untouched (column jobs)


def test_a_column_job_keeps_sharing_identical_prompts(tmp_path: Any) -> None:
    from testkit import make_spec

    spec = make_spec(tmp_path)
    rows = [{"row_id": f"r{i}", "text": "same"} for i in range(3)]
    _, groups = plan_rows(spec, rows, set())
    assert [len(ids) for _, ids in groups.values()] == [3] and store_key(next(iter(groups))) is not None


def test_a_draws_answer_is_never_stored() -> None:
    """A draw's row carries no prompt_key, so the result store keeps only the seeded line's answer."""
    import msgspec

    spec = batch_spec()
    groups = groups_of(spec, [{"temperature": 1.0}, {"temperature": 1.0, "seed": 2}])
    rows = []
    for group, (prompt, ids) in groups.items():
        answer = Answer.of_engine(EngineResult(ids[0], "ha", 3, 1, finish_reason="stop"), spec, prompt,
                                  store_key(group), "m")
        rows.append({**msgspec.to_builtins(row(ids[0], "v", answer)), "raw_confidence": None, "reviewed_by": None})
    assert [r["prompt_key"] is None for r in rows] == [store_key(g) is None for g in groups]
    stored = new_answers(pa.Table.from_pylist(rows))
    assert [r["prompt_key"] for r in stored] == [g for g in groups if store_key(g) is not None]


def test_run_batch_takes_a_default_temperature_and_otherwise_leaves_the_apis() -> None:
    import argparse

    from sparkbatch_dagster.cli.batch import _sampling

    assert "temperature" not in _sampling(argparse.Namespace(max_tokens=9)).model_fields_set  # lines get 1.0
    zero = _sampling(argparse.Namespace(max_tokens=9, temperature=0.0))
    spec = JobSpec(name="b", input="x.jsonl", input_format="openai_batch", sampling=zero)
    assert len(groups_of(spec, [{}] * 2)) == 1  # greedy: one answer for both lines
