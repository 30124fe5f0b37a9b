"""The tests of tests/unit/test_hosted_prices.py that start processes: the CLI, Dagster runs (their
log capture), servers, kills. That file says what they cover."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from sparkbatch_dagster import build_batch_assets
from sparkbatch_dagster.spec import EstimateSpec
from testkit import fake_resource, make_spec, unique_rows, write_parquet
from unit.test_hosted_prices import TABLE


def _prompt_tokens(spec, rows):
    """The fake engine's count, by hand: a token a word of system + user message, plus 4."""
    return sum(len(f"{spec.system_prompt}\nWhat kind of thing is this? {r['text']}".split()) + 4 for r in rows)


def test_the_estimate_asset_and_report_put_the_job_beside_hosted_batch(tmp_path):
    rows = unique_rows(60)  # every prompt distinct: the job's prompts are its rows
    src = write_parquet(tmp_path / "in" / "rows.parquet", rows)
    est = EstimateSpec(sample_rows=60, warmup_rows=0, fill_batch=False, min_sample_seconds=0, hourly_rate_usd=0.8,
                       hosted_prices=TABLE)
    spec = make_spec(tmp_path, input=str(src), shards=2, estimate=est)
    job = build_batch_assets(spec=spec)
    result = materialize(job.assets, selection=[job.keys["input_shards"], job.keys["estimate"]],
                         resources={"vllm": fake_resource()[0]}, instance=DagsterInstance.get())
    assert result.success
    md = result.asset_materializations_for_node("things__estimate")[0].metadata
    report = json.loads(Path(md["report"].value).read_text())
    # The sample is the whole job: its measured tokens are the job's, counted here from the input.
    assert report["sample_rows"] == report["prompts_to_generate"] == 60
    tokens_in, tokens_out = _prompt_tokens(spec, rows), 60  # a label is one word: one token
    assert (report["predicted_input_tokens"], report["predicted_output_tokens"]) == (tokens_in, tokens_out)
    expected = {"offer-a": tokens_in * 0.5 / 1e6 + tokens_out * 2.0 / 1e6,
                "offer-b": tokens_in * 0.04 / 1e6 + tokens_out * 0.12 / 1e6}
    assert {h["name"]: h["cost_usd"] for h in report["hosted"]} == pytest.approx(expected, abs=1e-6)
    # Beside the box: the metadata has both, the models table a column per offer, the advice a line.
    assert md["hosted_cost_usd offer-a"].value == pytest.approx(expected["offer-a"], abs=1e-6)
    box = next(o for o in report["options"] if o["name"] == "this machine")
    assert md["cost_usd this machine"].value == box["cost_usd"] is not None  # the box's option, beside them
    assert "hosted: offer-b $" in md["models"].value and "hosted: offer-a" in md["cost_chart"].value
    assert "test figures" in md["hosted_prices"].value
    line = next(a for a in report["advice"] if a.startswith("At your hosted batch prices"))
    assert f"{tokens_in:,} input" in line and f"'offer-a' ${expected['offer-a']:.4f}" in line
    assert f"${report['best_cost_usd']:.4f} on 'this machine'" in line


def test_the_cli_takes_a_price_file_and_stops_early_on_a_bad_one(tmp_path):
    from e2e.test_estimate import _cli

    prices = tmp_path / "prices.yaml"
    prices.write_text("- {name: offer-a, input_per_million_usd: 0.5, output_per_million_usd: 2.0}\n")
    out = json.loads(_cli(tmp_path, "estimate", "--sample-rows", "20", "--hosted-prices", str(prices)
                          ).stdout.strip().splitlines()[-1])
    (hosted,) = out["hosted"]
    assert hosted["cost_usd"] == pytest.approx(
        (out["predicted_input_tokens"] * 0.5 + out["predicted_output_tokens"] * 2.0) / 1e6, abs=1e-6)
    assert out["models"][0]["hosted_cost_usd"] == {"offer-a": hosted["cost_usd"]}
    report = tmp_path / "home" / "estimate" / "estimate.json"
    before = report.stat().st_mtime_ns
    prices.write_text("- {name: offer-a, input_per_million_usd: -1, output_per_million_usd: 2.0}\n")
    bad = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "estimate", "--hosted-prices", str(prices),
                          "-f", str(tmp_path / "defs.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert bad.returncode != 0 and "input_per_million_usd=-1" in bad.stderr
    assert report.stat().st_mtime_ns == before  # stopped before the estimate ran
