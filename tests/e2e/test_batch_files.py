"""The tests of tests/unit/test_batch_files.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sparkbatch_dagster.cli import main
from sparkbatch_dagster.cli.commands import run_batch
from sparkbatch_dagster.definitions.batch_files import batch_file_job, export_batch
from sparkbatch_dagster.spec.batch_prompt import request_prompt
from sparkbatch_dagster.testing import FakeVLLMResource

URL = "/v1/chat/completions"


def openai_line(cid: Any, content: str = "hello", **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL,
                       "body": {"model": "gpt-x", "messages": [{"role": "user", "content": content}], **body}})


#: Each hostile line and OpenAI's error code for it (issue 59: OpenAI's codes, not the job's kinds).
HOSTILE = {
    "{not json": "invalid_json_line",
    json.dumps({"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}):
        "unsupported_value",
    json.dumps({"custom_id": "get", "method": "GET", "url": URL, "body": {}}): "invalid_value",
    json.dumps({"custom_id": "nobody", "method": "POST", "url": URL}): "missing_required_parameter",
    json.dumps({"method": "POST", "url": URL, "body": {"messages": [{"role": "user", "content": "x"}]}}):
        "missing_required_parameter",
    openai_line("tools", tools=[{"type": "function", "function": {"name": "f"}}]): "unsupported_value",
    openai_line("audio", modalities=["audio"]): "unsupported_value",
    json.dumps({"custom_id": "img", "method": "POST", "url": URL, "body": {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}}): "unsupported_value",
    openai_line("hot", temperature=9): "invalid_value",
    "[1, 2]": "invalid_value",
    openai_line("a", "the same id again"): "duplicate_custom_id",
}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _check_openai(out: Path, err: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every line parsed with the openai package's own models; each custom_id once across both files."""
    from openai.types.chat import ChatCompletion
    from openai.types.shared import ErrorObject

    ok, bad = _lines(out), _lines(err)
    for line in ok:
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["response"]["status_code"] == 200
        ChatCompletion.model_validate(line["response"]["body"], strict=False)
    for line in bad:  # the request's own failure is its HTTP answer; ``error`` is for requests never answered
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        ErrorObject.model_validate(line["response"]["body"]["error"], strict=True)
        assert line["response"]["status_code"] in (400, 500) and line["response"]["body"]["error"]["message"]
    ids = [x["custom_id"] for x in ok + bad]
    assert len(ids) == len(set(ids))
    return ok, bad


def test_openai_file_every_line_once_hostile_lines_as_errors(tmp_path: Path) -> None:
    good = [openai_line(f"r{i}", f"question {i}", max_tokens=8) for i in range(12)]
    good.insert(3, openai_line("a", "first a"))
    (tmp_path / "in.jsonl").write_text("\n".join(good + [""] + list(HOSTILE)) + "\n")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True), shard_size=5)
    summary = run_batch(job, defs, tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert summary["success"] and summary["rows"] == len(good) + len(HOSTILE)
    ok, bad = _check_openai(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    assert sorted(x["custom_id"] for x in ok) == sorted(["a", *(f"r{i}" for i in range(12))])
    assert summary["export"] == {**summary["export"], "written": 13, "errors": len(HOSTILE), "remaining": 0,
                                 "complete": True}
    kinds = sorted(x["response"]["body"]["error"]["code"] for x in bad)
    assert kinds == sorted(HOSTILE.values())
    by_id = {x["custom_id"]: x["response"]["body"]["error"] for x in bad}
    assert by_id["a#dup2"]["code"] == "duplicate_custom_id" and "a" in by_id["a#dup2"]["message"]
    assert "/v1/embeddings" in by_id["emb"]["message"]
    assert "tools" in by_id["tools"]["message"] and "modalities" in by_id["audio"]["message"]
    assert "image_url" in by_id["img"]["message"] and "temperature" in by_id["hot"]["message"]
    nameless = [x for x in bad if x["custom_id"].startswith(("unparsable-line-", "null-id-"))]
    assert len(nameless) == 3  # bad JSON, a list, no custom_id: named after their line, never dropped


def test_a_line_sets_its_own_sampling_and_output(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}}}
    lines = [openai_line("short", "tell me", max_tokens=2, temperature=0),
             openai_line("long", "tell me", max_completion_tokens=50, temperature=0),
             openai_line("plain", "tell me more")]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    res = FakeVLLMResource(keep_warm=True, answer="one two three four five")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=res)
    run_batch(job, defs, tmp_path / "out.jsonl", None)
    ok, _ = _check_openai(tmp_path / "out.jsonl", tmp_path / "none.jsonl")
    got = {x["custom_id"]: x["response"]["body"]["choices"][0] for x in ok}
    assert got["short"]["message"]["content"] == "one two" and got["short"]["finish_reason"] == "length"
    assert got["long"]["message"]["content"] == "one two three four five" and got["long"]["finish_reason"] == "stop"
    # The same messages under other settings are another prompt: never answered from the other's row.
    keys = [request_prompt(_request(job, cid), job.spec.sampling).answer_key(job.spec.sampling, job.spec.output)
            for cid in ("short", "long")]
    assert None not in keys and keys[0] != keys[1]

    (tmp_path / "json.jsonl").write_text(openai_line("js", "a dog", response_format={
        "type": "json_schema", "json_schema": {"name": "animal", "schema": schema}}) + "\n")
    job, defs = batch_file_job(tmp_path / "json.jsonl", resource=FakeVLLMResource(keep_warm=True))
    run_batch(job, defs, tmp_path / "json-out.jsonl", tmp_path / "json-err.jsonl")
    (line,), _ = _check_openai(tmp_path / "json-out.jsonl", tmp_path / "json-err.jsonl")
    assert set(json.loads(line["response"]["body"]["choices"][0]["message"]["content"])) == {"name", "legs"}


def _request(job: Any, cid: str) -> str:
    import pyarrow.parquet as pq

    for key in job.home.read_manifest()["keys"]:
        for row in pq.read_table(job.home.shard_path(key)).to_pylist():
            if row["row_id"] == cid:
                return str(row["request"])
    raise AssertionError(cid)


def test_anthropic_file_parsed_with_anthropic_types(tmp_path: Path) -> None:
    from anthropic.types.messages import MessageBatchIndividualResponse

    def line(cid: str, **params: Any) -> str:
        return json.dumps({"custom_id": cid, "params": {"model": "claude-x", "max_tokens": 16, **params}})

    lines = [line("p1", messages=[{"role": "user", "content": "hi"}]),
             line("p2", system="Be brief.", messages=[{"role": "user", "content": [{"type": "text", "text": "hey"}]}]),
             line("p3", system=[{"type": "text", "text": "Sys"}], messages=[{"role": "user", "content": "yo"}]),
             json.dumps({"custom_id": "nomax", "params": {"messages": [{"role": "user", "content": "x"}]}}),
             line("tool", messages=[{"role": "user", "content": "x"}], tools=[{"name": "t"}]),
             line("p1", messages=[{"role": "user", "content": "again"}]), "nope"]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True))
    assert job.spec.input_format == "anthropic_batch"  # sniffed
    run_batch(job, defs, tmp_path / "results.jsonl", None)
    results = [MessageBatchIndividualResponse.model_validate(x) for x in _lines(tmp_path / "results.jsonl")]
    assert len(results) == len(lines) and len({r.custom_id for r in results}) == len(lines)
    kinds = {r.custom_id: r.result.type for r in results}
    assert [k for k, v in kinds.items() if v == "succeeded"] == sorted(["p1", "p2", "p3"], key=list(kinds).index)
    errored = {r.custom_id: r.result.error.error.message for r in results if r.result.type == "errored"}
    assert "max_tokens" in errored["nomax"] and "tools" in errored["tool"] and "duplicate_id" in errored["p1#dup2"]


def test_failed_run_exports_what_finished_then_resumes(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("\n".join(openai_line(f"r{i}", f"q {i}") for i in range(40)) + "\n")
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    broken = FakeVLLMResource(keep_warm=False, fail_after=25)
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=broken, shard_size=10, checkpoint_rows=1)
    with pytest.raises(Exception, match="died after 25"):
        run_batch(job, defs, out, err)
    partial = export_batch(job, out, err, broken)
    ok, bad = _check_openai(out, err)
    assert 0 < len(ok) <= 25 and not bad and partial.remaining == 40 - len(ok) and not partial.complete
    assert len(ok) > 20  # the failed shard's checkpointed rows too, not only the committed shards
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True), shard_size=10,
                               checkpoint_rows=1)
    summary = run_batch(job, defs, out, err)
    ok, bad = _check_openai(out, err)
    assert len(ok) == 40 and summary["export"]["complete"]


def test_cli_export_batch_and_errors_in_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.jsonl").write_text(openai_line("x") + "\n{bad\n")
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True))
    run_batch(job, defs, tmp_path / "first.jsonl", None)
    assert main(["export-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "all.jsonl")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["written"] == 1 and summary["errors"] == 1 and summary["complete"]
    assert sorted(x["response"]["status_code"] for x in _lines(tmp_path / "all.jsonl")) == [200, 400]


def test_a_run_stopped_before_its_first_commit_still_exports_its_rows(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("\n".join(openai_line(f"r{i}", f"q {i}") for i in range(30)) + "\n")
    broken = FakeVLLMResource(keep_warm=False, fail_after=7)
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=broken, checkpoint_rows=1)
    with pytest.raises(Exception, match="died after 7"):
        run_batch(job, defs, tmp_path / "out.jsonl", None)
    assert job.home.read_current() is None  # no partition committed
    ok, _ = _check_openai(tmp_path / "out.jsonl", tmp_path / "none.jsonl")
    assert len(ok) == 7  # run_batch wrote the checkpointed rows as it stopped


def test_a_bucket_homes_batch_exports_on_a_new_box_while_unfinished_then_completes(tmp_path: Path,
                                                                                   s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/jobs/batch"
    (tmp_path / "in.jsonl").write_text("\n".join(openai_line(f"r{i}", f"q {i}") for i in range(40)) + "\n")
    broken = FakeVLLMResource(keep_warm=False, fail_after=25)
    job, defs = batch_file_job(tmp_path / "in.jsonl", resource=broken, shard_size=10, home=url,
                               cache_dir=str(tmp_path / "box-a"))
    with pytest.raises(Exception, match="died after 25"):
        run_batch(job, defs, tmp_path / "a.jsonl", tmp_path / "a-err.jsonl")
    # Another box, an empty cache, the same bucket: what box A committed is exported from there.
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    box_b, defs_b = batch_file_job(tmp_path / "in.jsonl", resource=FakeVLLMResource(keep_warm=True), shard_size=10,
                                   home=url, cache_dir=str(tmp_path / "box-b"))
    version = job.output_version(broken)
    partial = export_batch(box_b, out, err, version=version)
    ok, bad = _check_openai(out, err)
    committed = {r["row_id"] for key in job.home.read_manifest()["keys"] if job.home.is_done(version, key)
                 for r in pq.read_table(job.home.labeled_path(version, key)).to_pylist()}
    assert len(committed) >= 10 and committed <= {line["custom_id"] for line in ok}  # every committed row
    assert not bad and partial.remaining == 40 - len(ok) and not partial.complete
    summary = run_batch(box_b, defs_b, out, err)  # box B finishes the job: every custom_id once
    ok, bad = _check_openai(out, err)
    assert sorted(line["custom_id"] for line in ok) == sorted(f"r{i}" for i in range(40)) and not bad
    assert summary["export"]["complete"] and (tmp_path / "box-b").exists()
