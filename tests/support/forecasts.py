"""Estimate records made by hand, for tests of what the estimate does with them (cascades, choices):
a model priced on one test box, and its sample's rows.

Example::

    small, big = priced_model("small", wall_s=100, start_s=10), priced_model("big", wall_s=400, start_s=30)
    cascades.evaluate([small, big], [sample_timing("small", rows_a), sample_timing("big", rows_b)], bar=0.8)
"""

from __future__ import annotations

from sparkbatch_dagster.estimate.records import ModelForecast, OptionPrice
from sparkbatch_dagster.estimate.sample import Timing


def priced_model(name: str, wall_s: float, start_s: float) -> ModelForecast:
    """A model priced on one box at $3.6/h (a dollar a thousand seconds); the rest of its forecast is blank."""
    box = OptionPrice(name="box", nodes=1, gpus_per_node=1, hourly_usd=3.6, hardware="test box", speed_basis="measured",
                      fits=True, wall_s=wall_s, cost_usd=3.6 * (wall_s + start_s) / 3600)
    blank = dict(weights_gb=None, sample_rows=0, extra_rows=0, sample_steps=[], sample_correct=None, sample_s=0.0,
                 sample_tokens=0, sample_errors=0, accuracy=None, accuracy_low=None, accuracy_high=None, stored_rows=0,
                 stored_prompts=0, stored_exact=True, prompts_to_generate=0, predicted_tokens=0,
                 predicted_wall_s=wall_s,
                 predicted_tokens_per_hour=0, sample_engines=1, predicted_input_tokens=0, predicted_output_tokens=0,
                 hosted=[], measured_on="test box", measured_kind="test", measured_tokens_per_s=0.0,
                 best_speed_basis="measured", best_option="box", best_cost_usd=box.cost_usd)
    return ModelForecast(model=name, configured_as=name, engine_start_s=start_s, options=[box], **blank)


def sample_timing(name: str, rows: dict[str, tuple[float | None, bool]]) -> Timing:
    """A model's timed sample holding only its rows' (confidence, right)."""
    return Timing(model=name, engine_start_s=0.0, seconds=1.0, rows=len(rows), prompt_tokens=0, output_tokens=0,
                  errors=0, correct=sum(ok for _, ok in rows.values()), by_row=rows)
