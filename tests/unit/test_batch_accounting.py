"""The names a batch's unrun requests are listed under are the names the job gives its rows
(issue 59): :func:`job_row_ids` held to the shard query itself (DuckDB, ``inputs/ids.py``) over
random files: repeated ids, ids the job would generate (``#dup2``, ``unparsable-line-2``, ``~``),
lines the job cannot read (a raw NUL, no JSON, no id), blank and Unicode-blank lines. And the
validation of a big file keeps 8 bytes a line, not its ids."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkbatch_dagster.definitions.batch_files import batch_file_job
from sparkbatch_dagster.errors import InputError
from sparkbatch_dagster.inputs.shards import build_shards
from sparkbatch_dagster.serve.results import job_row_ids
from sparkbatch_dagster.serve.validate import MAX_ERRORS, validate_file

IDS = ["r1", "r2", "r1#dup2", "r1#dup2~", "r1#dup3", "unparsable-line-2", "unparsable-line-2~", "é"]
URL = "/v1/chat/completions"


def _line(kind: str, cid: str) -> str:
    request = {"custom_id": cid, "method": "POST", "url": URL, "body": {"messages": [{"role": "user",
                                                                                      "content": "hi"}]}}
    return {"ok": json.dumps(request), "nul": json.dumps(request).replace('"hi"', '"h\x00i"'), "junk": "{oops",
            "noid": json.dumps({**request, "custom_id": None}), "list": "[1]", "blank": "",
            "uniblank": "\u3000\x1c", "field": json.dumps({**request, "x": 1})}[kind]


LINES = st.lists(st.tuples(st.sampled_from(["ok", "ok", "ok", "nul", "junk", "noid", "list", "blank", "uniblank",
                                            "field"]), st.sampled_from(IDS)), min_size=1, max_size=14)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=LINES)
def test_unrun_requests_are_named_as_the_job_names_its_rows(tmp_path_factory, lines):
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("ids")
    src = folder / "in.jsonl"
    src.write_text("\n".join(_line(kind, cid) for kind, cid in lines) + "\n", encoding="utf-8")
    if not any(kind in ("ok", "noid", "field") for kind, _ in lines):
        return  # no JSON object on any line: the job refuses the file (every line is then unrun)
    job, _ = batch_file_job(src, "openai_batch", home=folder / "home", shard_size=4)
    try:
        manifest = build_shards(job.spec, job.home)
    except InputError:  # a file the job refuses whole (mostly control bytes): it names no row at all
        return
    shards = [job.home.shard_path(key) for key in manifest["keys"]]
    named = [r for p in shards if p.exists() for r in pq.read_table(p, columns=["row_id"]).column(0).to_pylist()]
    assert sorted(job_row_ids(src)) == sorted(named)
    assert len(set(named)) == len(named)


def test_validation_finds_repeats_without_keeping_every_id(tmp_path: Path):
    lines = [json.dumps({"custom_id": f"r{i}", "url": URL}) for i in range(3000)]
    lines[2500] = json.dumps({"custom_id": "r7", "url": URL})  # line 2501 repeats line 8
    lines[2600] = json.dumps({"custom_id": "z", "url": "/v1/embeddings"})  # and line 2601's url is wrong
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    problems = validate_file(tmp_path / "in.jsonl", URL)
    assert [(p.line, p.code) for p in problems] == [(2501, "duplicate_custom_id"), (2601, "url_mismatch")]
    assert "line 8" in (problems[0].message or "") and problems[0].param == "custom_id"
    bad = [json.dumps({"custom_id": "same", "url": URL})] * (MAX_ERRORS + 5)
    (tmp_path / "bad.jsonl").write_text("\n".join(bad) + "\n")
    problems = validate_file(tmp_path / "bad.jsonl", URL)
    assert len(problems) == MAX_ERRORS and problems[0].line == 2 and problems[-1].code == "too_many_errors"
    assert (problems[-1].message or "").startswith("5 more lines")
