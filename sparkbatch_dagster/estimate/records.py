"""The estimate's typed records: what it predicts and prices, as it crosses into ``definitions``
and ``cli``. Each record gives its dict form through one method, ``to_json``, used only at the
edges (the report file, the CLI's JSON, Dagster metadata); its keys and their order are the
report's (``estimate.json``), which tests pin.

    OptionPrice   one node option's price for one model (``speed_basis``, duration, cost, how)
    HostedQuote   the same tokens at one hosted batch offer
    ModelForecast one model's prediction for the whole job, priced on every option
    Calibrated, ReviewBudget, ReviewPlan  its confidence figures (``review_records.py``)
    Cascade       a pair of models at its picked threshold (``CascadePoint``), with its curve
    BestBuy       the cheapest that clears the bar: a model alone or a cascade
    EstimateReport the whole report; its dict form flattens the configured model into it
    Prediction    the prediction file each estimate writes per version (read back by the run)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import msgspec

from .record_base import Record, SpeedBasis
from .review_records import Calibrated, ReviewBudget, ReviewPlan

__all__ = ["BestBuy", "Calibrated", "Cascade", "CascadeOption", "CascadePoint", "EstimateReport", "HostedQuote",
           "LeftOut", "ModelForecast", "OptionPrice", "Prediction", "Projected", "Record",
           "ReviewBudget", "ReviewPlan", "SpeedBasis", "Stage"]


class Projected(Record, frozen=True, kw_only=True):
    """A roofline projection's figures, as a priced option carries them (``estimate/roofline.py``)."""

    low_s: float
    high_s: float
    prefill_peak_s: float
    decode_peak_s: float
    concurrency: int


class OptionPrice(Record, frozen=True, kw_only=True):
    """One node option for one model: how it runs the model, where its speed comes from, and the
    whole job's duration and cost there (engine start included). A projected option's ``wall_s`` /
    ``cost_usd`` are its range's slow end, ``wall_low_s`` / ``cost_low_usd`` its fast end; an
    unknown one has no price (``why`` says what is missing)."""

    name: str
    nodes: int
    gpus_per_node: int
    hourly_usd: float
    hardware: str
    speed_basis: SpeedBasis
    projection: Projected | None = None
    why: str | None = None
    tensor_parallel_size: int | None = None
    fits: bool = False
    engines: int = 0
    settings: dict[str, Any] | None = None
    how: str = ""
    wall_s: float | None = None
    wall_low_s: float | None = None
    cost_usd: float | None = None
    cost_low_usd: float | None = None


class HostedQuote(Record, frozen=True, kw_only=True):
    """The job's tokens (as this model's tokenizer counts them) at one hosted batch offer."""

    name: str
    input_tokens: int
    output_tokens: int
    input_per_million_usd: float
    output_per_million_usd: float
    cost_usd: float
    note: str | None = None


class ModelForecast(Record, frozen=True, kw_only=True):
    """One model's timed sample extrapolated to the prompts the job still has to generate, and
    priced on every node option. ``configured_as`` / ``engine_kwargs`` say how to run it,
    ``identity`` / ``dtype`` what ran (set by the estimate once the model is known)."""

    model: str
    weights_gb: float | None
    engine_start_s: float
    sample_rows: int
    extra_rows: int
    sample_steps: list[list[int]]
    sample_correct: int | None
    sample_s: float
    sample_tokens: int
    sample_errors: int
    accuracy: float | None
    accuracy_low: float | None
    accuracy_high: float | None
    stored_rows: int
    stored_prompts: int
    stored_exact: bool
    prompts_to_generate: int
    predicted_tokens: int
    predicted_wall_s: float
    predicted_tokens_per_hour: int
    sample_engines: int
    options: list[OptionPrice]
    predicted_input_tokens: int
    predicted_output_tokens: int
    hosted: list[HostedQuote]
    measured_on: str
    measured_kind: str
    measured_tokens_per_s: float
    best_speed_basis: SpeedBasis | None
    best_option: str | None
    best_cost_usd: float | None
    #: Accuracy per confidence bucket on the sample (``run/reliability.py``), or None.
    reliability: list[dict[str, Any]] | None = None
    configured_as: str | None = None
    engine_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    identity: str | None = None
    dtype: str | None = None
    dtype_reason: str | None = None
    #: With a gold column and confidences: the calibration, the review budget, the review plan
    #: (``JobSpec.review``) and their chart (reliability before/after, rows reviewed -> errors caught).
    calibration: Calibrated | None = None
    review_budget: ReviewBudget | None = None
    review_plan: ReviewPlan | None = None
    review_chart: str | None = None
    #: The sample's rows with a truth (a gold value that says something, ``run/truth.py``): the
    #: accuracy's rows. None without a gold column (and in records written before it: every row).
    sample_truth_rows: int | None = None

    def option(self, name: str) -> OptionPrice | None:
        """The priced option called ``name``, or None."""
        return next((o for o in self.options if o.name == name), None)

    @property
    def scored_rows(self) -> int:
        """The sample rows its accuracy is over: those with a truth."""
        return self.sample_rows if self.sample_truth_rows is None else self.sample_truth_rows


class CascadeOption(Record, frozen=True, kw_only=True):
    """A cascade's whole job on one node option at one threshold (None: not priced there)."""

    name: str
    wall_s: float | None
    cost_usd: float | None


class CascadePoint(Record, frozen=True, kw_only=True):
    """A pair of models at one threshold: accuracy (95% Wilson interval), escalated share, cost per
    option; on every sample row (a curve's point) or held out (a cascade's pick)."""

    threshold: float
    accuracy: float
    accuracy_low: float
    accuracy_high: float
    escalated_share: float
    options: list[CascadeOption]
    best_option: str | None
    best_cost_usd: float | None


class Stage(Record, frozen=True, kw_only=True, omit_defaults=True):
    """One model of a cascade as the spec configures it: its answer stands at ``below`` or more
    sure (the last stage has no threshold, and no ``below`` key)."""

    model: str | None
    below: float | None = None


class Cascade(Record, frozen=True, kw_only=True):
    """An ordered pair of models judged on the sample (``estimate/cascades.py``). ``pick`` is the
    threshold picked on every sample row (the one to configure) with its figures HELD OUT:
    ``folds``-fold cross-validated, each fold scored at the threshold picked on the others
    (``fold_thresholds``, fold by fold); ``clears`` is its held-out lower bound against the bar.
    ``in_sample_accuracy*`` is that threshold on the rows it was picked on, to compare (optimistic
    by construction). ``curve``: every threshold tried, each on every row. In the dict form the
    pick's fields are the cascade's."""

    model: str
    stages: list[str]
    configured_as: list[Stage]
    sample_rows: int
    clears: bool
    folds: int
    fold_thresholds: list[float]
    in_sample_accuracy: float
    in_sample_accuracy_low: float
    in_sample_accuracy_high: float
    pick: CascadePoint
    curve: list[CascadePoint]

    def to_json(self) -> dict[str, Any]:
        head = msgspec.to_builtins(self)
        pick, curve = head.pop("pick"), head.pop("curve")
        return {**head, **pick, "curve": curve}


class BestBuy(Record, frozen=True, kw_only=True):
    """The cheapest way over the accuracy bar: a model alone or a cascade."""

    kind: Literal["model", "cascade"]
    model: str
    cost_usd: float
    configured_as: str | list[Stage] | None


class LeftOut(Record, frozen=True, kw_only=True):
    """A candidate model that could not run, or is not timed on this platform, and why."""

    model: str
    error: str


class EstimateReport(Record, frozen=True, kw_only=True):
    """The estimate's report: the configured model (``primary``, first of ``models``), every model
    measured, the choice, cascades and advice; ``json`` / ``chart`` / ``cascade_chart`` are the
    files written. Its dict form (``estimate.json``) flattens ``primary`` into the report."""

    job: str
    base_sample_rows: int
    total_rows: int
    distinct_prompts: int
    primary: ModelForecast
    accuracy_bar: float
    max_sample_rows: int
    chosen: ModelForecast | None
    models: list[ModelForecast]
    failed_models: list[LeftOut]
    unrunnable_models: list[LeftOut]
    advice: list[str]
    cascades: list[Cascade]
    best_buy: BestBuy | None
    cascade_chart: str | None = None
    json_path: str | None = None
    chart: str | None = None

    @property
    def sample_rows(self) -> int:
        """Rows the configured model was timed on (more than ``base_sample_rows`` when it grew)."""
        return self.primary.sample_rows

    def to_json(self) -> dict[str, Any]:
        primary = self.primary.to_json()
        chosen = self.chosen
        return {
            "job": self.job, "base_sample_rows": self.base_sample_rows, "sample_rows": primary.pop("sample_rows"),
            "total_rows": self.total_rows, "distinct_prompts": self.distinct_prompts, **primary,
            "accuracy_bar": self.accuracy_bar, "max_sample_rows": self.max_sample_rows,
            "chosen_model": chosen.model if chosen else None,
            "chosen_configured_as": chosen.configured_as if chosen else None,
            "chosen_cost_usd": chosen.best_cost_usd if chosen else None,
            "models": [m.to_json() for m in self.models],
            "failed_models": [f.to_json() for f in self.failed_models],
            "unrunnable_models": [u.to_json() for u in self.unrunnable_models],
            "advice": list(self.advice), "cascades": [c.to_json() for c in self.cascades],
            "best_buy": self.best_buy.to_json() if self.best_buy else None,
            "cascade_chart": self.cascade_chart, "json": self.json_path, "chart": self.chart,
        }


class Prediction(Record, frozen=True, kw_only=True):
    """The prediction file of one output version (``JobHome.prediction_path``), written by every
    estimate; the run reads it for its ETA, its brake and predicted-vs-actual. Files written
    before a field existed read with its default."""

    model: str
    predicted_wall_s: float
    predicted_prompts: int | None = None
    stored_rows: int = 0
    engine_start_s: float | None = None
    best_cost_usd: float | None = None
    total_rows: int
    sample_rows: int
    made_at: str

    @classmethod
    def read(cls, path: Path) -> Prediction | None:
        """The prediction at ``path``, or None when there is none."""
        if not path.exists():
            return None
        return msgspec.json.decode(path.read_bytes(), type=cls)
