"""Estimate, then run, under a budget: `sparkbatch run --estimate` times the sample on the run's
own engine (one start), and the brake (`--max-cost`, `--deadline`) refuses or stops a run
cleanly, every finished row saved, no engine process left, with one line that says how to go on."""

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from sparkbatch_dagster.errors import BudgetStop, ConfigError
from sparkbatch_dagster.run.brake import Brake, Position, parse_deadline
from testkit import make_spec


def test_spec_brake_fields_are_checked():
    with pytest.raises(ConfigError, match=r"deadline=2026-12-01T18:00:00 has no time zone"):
        make_spec(Path("/tmp/unused-brake"), deadline=datetime(2026, 12, 1, 18))
    with pytest.raises(ConfigError, match=r"max_cost_usd.*greater than or equal to 0"):
        make_spec(Path("/tmp/unused-brake"), max_cost_usd=-1.0)


# --- the brake's arithmetic --------------------------------------------------------------------


def test_the_brake_prices_the_rest_at_the_measured_rate_or_the_estimates():
    brake = Brake(hourly_rate_usd=3600.0, max_cost_usd=10.0, spent_before_usd=2.0, predicted_rows_per_s=10.0,
                  restart_s=3.0)
    brake.check(Position(0, 60), spent_usd=1.0)  # 2 + 1 + 6 s of rows = $9: under the cap
    with pytest.raises(BudgetStop, match=r"refused before generating.*\$3.00 spent.*~\$12.00 in all") as stop:
        brake.check(Position(0, 90), spent_usd=1.0)  # $3 + 9 s = $12
    assert stop.value.raise_to_usd == 15.0  # and the engine start a continuation pays again
    with pytest.raises(BudgetStop, match=r"stopped.*30 of 90 rows done.*at the measured 5.0 rows/s"):
        brake.check(Position(30, 90, measured_rows_per_s=5.0), spent_usd=1.0)  # 60 rows / 5 = $12 more
    # No rate and no prediction: only money already spent stops it.
    blind = Brake(hourly_rate_usd=3600.0, max_cost_usd=10.0)
    blind.check(Position(0, 10**6), spent_usd=9.0)
    with pytest.raises(BudgetStop, match="rate not measured yet"):
        blind.check(Position(0, 10**6), spent_usd=11.0)


def test_the_brake_keeps_a_margin_before_the_deadline():
    now = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
    brake = Brake(hourly_rate_usd=0.79, deadline=now + timedelta(seconds=100), margin_s=30.0)
    brake.check(Position(10, 100, 1, 4, 1.0, longest_commit_s=10.0), 0.0, now=now + timedelta(seconds=49))
    with pytest.raises(BudgetStop, match=r"stopped 50 s before the deadline.*margin 50 s.*90 left.*~90 s"):
        brake.check(Position(10, 100, 1, 4, 1.0, longest_commit_s=10.0), 0.0, now=now + timedelta(seconds=50))
    assert parse_deadline("2h30m", now) == now + timedelta(hours=2, minutes=30)
    assert parse_deadline("90s", now) == now + timedelta(seconds=90)
