"""The estimate beside hosted batch APIs: the user's price table (no price built in), checked, and
the job's measured tokens priced at each offer, in the report, the asset's metadata and the CLI.
The numbers are checked by hand: tokens counted from the input, times the prices."""

from pathlib import Path

import pytest

from sparkbatch_dagster import ConfigError
from sparkbatch_dagster.estimate.forecast import predict
from sparkbatch_dagster.estimate.sample import Sample, Stored, Timing
from sparkbatch_dagster.spec import EstimateSpec, HostedPrice, NodeOption
from testkit import label_defs_yaml, yaml_job_spec

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
    assert p.predicted_input_tokens == 8_000 * 225 == 1_800_000
    assert p.predicted_output_tokens == 8_000 * 25 == 200_000
    assert p.predicted_input_tokens + p.predicted_output_tokens == p.predicted_tokens  # as the box counts
    a, b = p.hosted
    assert a.cost_usd == pytest.approx(1.8 * 0.5 + 0.2 * 2.0)  # 1.3
    assert b.cost_usd == pytest.approx(1.8 * 0.04 + 0.2 * 0.12)  # 0.096
    assert b.note == "test figures" and p.options[0].cost_usd is not None  # beside the box's option
    assert predict(sample, timing, [], 0.3).hosted == []  # no table: nothing hosted, nothing assumed


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


def test_the_docs_example_table_loads_and_says_it_is_made_up():
    path = Path(__file__).resolve().parents[2] / "docs" / "hosted-prices.example.yaml"
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
