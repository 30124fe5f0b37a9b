"""The CLI as a shell user pipes it: stdout is one JSON line, errors are one line, and the
prompts and the results can be seen without an engine (preview) or a DuckDB CLI (sql)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from testkit import make_rows, write_parquet

ROOT = Path(__file__).resolve().parents[2]

DEFS = """
from dagster import Definitions
from sparkbatch_dagster import JobSpec, OutputSpec, VLLMResource, build_batch_assets
from sparkbatch_dagster.testing import FakeVLLMResource
spec = JobSpec(name="things", input={src!r}, id_column="id", text_columns={cols!r},
               system_prompt="Answer with one word.", user_template="What is this? {{{{ text }}}}",
               output=OutputSpec(kind="label", labels=["fruit", "vehicle", "animal"]), shard_count=3,
               gold_column="gold", home={home!r})
job = build_batch_assets(spec=spec)
defs = Definitions(assets=job.assets, resources={{"vllm": {resource}}})
"""


def _defs(tmp_path: Path, cols=("text",), resource="FakeVLLMResource()") -> Path:
    src = write_parquet(tmp_path / "in" / "rows.parquet", make_rows(90))
    defs = tmp_path / "defs.py"
    defs.write_text(DEFS.format(src=str(src), home=str(tmp_path / "home"), cols=list(cols), resource=resource))
    return defs


def _cli(tmp_path: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode == 0) == ok, proc.stderr[-3000:]
    return proc


def test_stdout_is_exactly_one_json_line_for_status_and_run(tmp_path):
    defs = str(_defs(tmp_path))
    before = _cli(tmp_path, "status", "-f", defs)
    status = json.loads(before.stdout)  # the whole stdout, not its last line
    assert status["sharded"] is False and "sparkbatch run -f" in status["next"]
    assert "Warning" not in before.stderr
    run = _cli(tmp_path, "run", "-f", defs)
    summary = json.loads(run.stdout)
    assert summary["rows"] == 90 and summary["generated"] > 0 and summary["success"] is True
    assert "Warning" not in run.stderr and "DEBUG" not in run.stderr  # no framework log lines
    after = json.loads(_cli(tmp_path, "status", "-f", defs).stdout)
    assert after["partitions_done"] == 3 and after["missing"] == [] and "sql" in after["next"]


def test_an_error_is_one_line_with_the_fix_and_debug_shows_the_traceback(tmp_path):
    defs = str(_defs(tmp_path, cols=("text", "colour")))
    proc = _cli(tmp_path, "run", "-f", defs, ok=False)
    assert proc.stdout == ""
    # (A fresh Dagster home prints Dagster's one-time telemetry notice; nothing else may show.)
    lines = [x for x in proc.stderr.strip().splitlines() if x.startswith("sparkbatch:")]
    assert len(lines) == 1 and lines[0].startswith("sparkbatch: input has no column(s) ['colour']"), proc.stderr
    assert "fix id_column/text_columns/gold_column" in lines[0] and "Traceback" not in proc.stderr
    again = _cli(tmp_path, "run", "-f", defs, ok=False)  # the instance exists now: the line is all there is
    assert again.stderr.strip().splitlines() == lines
    loud = _cli(tmp_path, "run", "-f", defs, "--debug", ok=False)
    assert "Traceback" in loud.stderr and "InputError" in loud.stderr


def test_preview_shows_prompts_and_counts_without_an_engine(tmp_path):
    defs = str(_defs(tmp_path))
    proc = _cli(tmp_path, "preview", "-f", defs, "-n", "2")
    report = json.loads(proc.stdout)
    assert report["rows"] == 90 and len(report["shards"]) == 3 and len(report["prompts"]) == 2
    assert list(report) == ["job", "model", "dtype", "dtype_reason", "chat_template", "tokenizer", "rows", "error_rows",
                            "distinct_prompts", "duplicate_rows", "stored_prompts", "to_generate", "shards", "prompts",
                            "warnings"]  # the printed line's keys, in the order they have always had
    assert list(report["shards"][0]) == ["partition", "rows", "error_rows", "distinct_prompts", "duplicate_rows",
                                         "stored_prompts", "to_generate"]
    assert list(report["prompts"][0]) == ["partition", "row_ids", "rows", "messages", "text", "tokens"]
    assert not (tmp_path / "home").exists()  # a preview changes nothing: it sharded in a scratch folder
    # After a run every prompt is answered: preview says nothing is left to pay for.
    _cli(tmp_path, "run", "-f", defs)
    shards = [pq.read_table(f).column("text").to_pylist() for f in sorted((tmp_path / "home/shards").glob("*.parquet"))]
    unique = sum(len(set(texts)) for texts in shards)  # exact duplicates are found within a shard
    assert [s["distinct_prompts"] for s in report["shards"]] == [len(set(t)) for t in shards]
    assert report["distinct_prompts"] == report["to_generate"] == unique
    assert report["duplicate_rows"] == 90 - unique and report["stored_prompts"] == 0
    assert "What is this?" in report["prompts"][0]["text"] and "--- prompt 1" in proc.stderr
    again = json.loads(_cli(tmp_path, "preview", "-f", defs).stdout)
    assert again["to_generate"] == 0 and again["stored_prompts"] == unique


def test_preview_applies_the_models_chat_template_and_counts_tokens(tmp_path):
    from sparkbatch_dagster.engines.platform.model import DEFAULT_MODEL_NAME, model_cache_dir

    if not (model_cache_dir() / DEFAULT_MODEL_NAME / "tokenizer_config.json").exists():
        pytest.skip("embedded SmolLM2 not converted (make model)")
    defs = str(_defs(tmp_path, resource="VLLMResource()"))  # the real default: offline, embedded SmolLM2; no engine
    report = json.loads(_cli(tmp_path, "preview", "-f", defs, "-n", "1").stdout)
    [prompt] = report["prompts"]
    assert report["chat_template"] is True and report["model"].startswith("SmolLM2-135M-Instruct@")
    assert prompt["text"].startswith("<|im_start|>system\nAnswer with one word.<|im_end|>")
    assert prompt["text"].endswith("<|im_start|>assistant\n") and 15 < prompt["tokens"] < 60


def test_sql_answers_analytics_queries(tmp_path):
    defs = str(_defs(tmp_path))
    _cli(tmp_path, "run", "-f", defs)
    dist = json.loads(_cli(tmp_path, "sql", "-f", defs, "FROM label_distribution").stdout)
    assert dist["columns"] == ["label", "rows"] and sum(r[1] for r in dist["rows"]) == 90
    labeled = [r for f in (tmp_path / "home" / "out").rglob("labeled/*.parquet") for r in pq.read_table(f).to_pylist()]
    counts = {lab: sum(r["output"] == lab for r in labeled) for lab in {r["output"] for r in labeled}}
    assert dict(map(tuple, dist["rows"])) == counts
    bad = _cli(tmp_path, "sql", "-f", defs, "FROM no_such_view", ok=False)
    assert bad.stderr.startswith("sparkbatch: query failed: Catalog Error") and bad.stdout == ""


def test_the_command_leaves_its_heap_to_the_exit_uncollected(tmp_path):
    """The CLI freezes what is alive once its exit handlers have run (Python's last collections
    would walk it all before the process frees it anyway: 0.5 to 1 s of a command's end): a
    handler registered before the CLI's module, so run after its own, finds the heap frozen."""
    probe = ("import atexit, gc, sys\n"
             "atexit.register(lambda: print(gc.get_freeze_count(), file=sys.stderr))\n"
             "from sparkbatch_dagster.cli.entry import main\n"
             "raise SystemExit(main(['status', '-f', sys.argv[1]]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe, str(_defs(tmp_path))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["sharded"] is False
    assert int(proc.stderr.strip().splitlines()[-1]) > 100_000, proc.stderr[-500:]
