"""The estimate beside hosted batch APIs: the user's price table (no price built in), checked, and
the job's measured tokens priced at each offer, in the report, the asset's metadata and the CLI.
The numbers are checked by hand: tokens counted from the input, times the prices."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from testkit import fake_resource, label_defs_yaml, make_spec, unique_rows, write_parquet, yaml_job_spec
from sparkbatch_dagster import ConfigError, build_batch_assets
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.sample import Sample, Stored, Timing
from sparkbatch_dagster.spec import EstimateSpec, HostedPrice, NodeOption

#: Made-up figures for the tests, not anyone's prices.
TABLE = [{"name": "offer-a", "input_per_million_usd": 0.5, "output_per_million_usd": 2.0},
         {"name": "offer-b", "input_per_million_usd": 0.04, "output_per_million_usd": 0.12, "note": "test figures"}]


def test_prediction_prices_the_jobs_tokens_at_each_offer():
    # 50 sample rows, 40 distinct prompts, 9,000 prompt and 1,000 output tokens; 9,000 prompts to
    # generate of which 1,000 are stored: 8,000 x (225 input, 25 output) tokens.
    sample = Sample(rows=[{}] * 50, warmup=[], total_rows=10_000, distinct_prompts=9_000)
    timing = Timing(model="m", engine_start_s=60.0, seconds=10.0, rows=50, prompt_tokens=9000, output_tokens=1000,
                    errors=0, correct=None, requests=40)
    p = predict(sample, timing, [NodeOption(name="box", hourly_usd=1.0, hardware="this-machine")], 0.3,
                Stored(1_100, 1_000, 8_000), hosted=[HostedPrice(**t) for t in TABLE])
    assert p["predicted_input_tokens"] == 8_000 * 225 == 1_800_000
    assert p["predicted_output_tokens"] == 8_000 * 25 == 200_000
    assert p["predicted_input_tokens"] + p["predicted_output_tokens"] == p["predicted_tokens"]  # as the box counts
    a, b = p["hosted"]
    assert a["cost_usd"] == pytest.approx(1.8 * 0.5 + 0.2 * 2.0)  # 1.3
    assert b["cost_usd"] == pytest.approx(1.8 * 0.04 + 0.2 * 0.12)  # 0.096
    assert b["note"] == "test figures" and p["options"][0]["cost_usd"] is not None  # beside the box's option
    assert predict(sample, timing, [], 0.3)["hosted"] == []  # no table: nothing hosted, nothing assumed


@pytest.mark.parametrize(("row", "words"), [
    ({"name": "x", "input_per_million_usd": -0.1, "output_per_million_usd": 1}, ["'x'", "input_per_million_usd=-0.1",
                                                                                "negative"]),
    ({"name": "x", "input_per_million_usd": 0.1}, ["'x'", "has no output_per_million_usd"]),
    ({"name": "x", "input_per_million_usd": "cheap", "output_per_million_usd": 1}, ["'cheap'", "not a number"]),
])
def test_a_bad_price_names_the_offer_the_value_and_the_fix(row, words):
    with pytest.raises(ConfigError) as err:
        EstimateSpec(hosted_prices=[row])
    assert all(w in str(err.value) for w in [*words, "estimate.hosted_prices", "price per million"])


def test_a_table_from_csv_or_yaml_is_checked_row_by_row(tmp_path):
    csv = tmp_path / "prices.csv"
    csv.write_text("name,input_per_million_usd,output_per_million_usd,note\n"
                   "offer-a,0.5,2.0,\noffer-b,0.04,0.12,test figures\n")
    yaml = tmp_path / "prices.yaml"
    yaml.write_text("hosted_prices:\n" + "".join(
        f"  - {{name: {t['name']}, input_per_million_usd: {t['input_per_million_usd']}, "
        f"output_per_million_usd: {t['output_per_million_usd']}}}\n" for t in TABLE))
    for path in (csv, yaml):
        got = EstimateSpec(hosted_prices=str(path)).hosted_prices
        assert [(h.name, h.input_per_million_usd, h.output_per_million_usd) for h in got] == [
            ("offer-a", 0.5, 2.0), ("offer-b", 0.04, 0.12)]
    csv.write_text("name,input_per_million_usd,output_per_million_usd\nok,1,1\nbad,0.5,\n")
    with pytest.raises(ConfigError, match=r"prices.csv row 2: hosted price 'bad' has no output_per_million_usd"):
        EstimateSpec(hosted_prices=str(csv))
    with pytest.raises(ConfigError, match="listed twice"):
        EstimateSpec(hosted_prices=TABLE + TABLE[:1])


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
    from test_estimate import _cli

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
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert bad.returncode != 0 and "input_per_million_usd=-1" in bad.stderr
    assert report.stat().st_mtime_ns == before  # stopped before the estimate ran


def test_the_docs_example_table_loads_and_says_it_is_made_up():
    path = Path(__file__).resolve().parents[1] / "docs" / "hosted-prices.example.yaml"
    table = EstimateSpec(hosted_prices=str(path)).hosted_prices
    assert table and all("made-up" in (h.note or "") for h in table)
    assert "EXAMPLE ONLY" in path.read_text().splitlines()[0]


def test_a_price_table_travels_from_a_defs_yaml(tmp_path):
    text = label_defs_yaml(tmp_path, """\
        estimate:
          hosted_prices:
            - {name: offer-a, input_per_million_usd: 0.5, output_per_million_usd: 2.0}
    """)
    (offer,) = yaml_job_spec(text).estimate.hosted_prices
    assert (offer.name, offer.input_per_million_usd, offer.output_per_million_usd) == ("offer-a", 0.5, 2.0)
