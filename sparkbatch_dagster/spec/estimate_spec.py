"""The estimate's settings: how to rent the box (:class:`NodeOption`) and how to time a sample and
choose a model (:class:`EstimateSpec`), with the user's hosted batch prices beside them.

Example::

    EstimateSpec(sample_rows=200, options=[NodeOption(name="DGX Spark", hourly_usd=0.79, hardware="dgx-spark")])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .checked import Checked
from .hardware import PRESETS, THIS_MACHINE, HardwareSpec, ModelCandidate
from .hosted import HostedPrice, check_table, load_hosted_prices


class NodeOption(BaseModel):
    """One way to rent the box. ``hourly_usd`` is the price of all ``nodes`` together; the
    estimate prices a model only on options whose GPUs hold it, and says how to run each
    (``sparkbatch_dagster.estimate.placement``). ``hardware`` says what the speed is: an option on the kind
    of machine the sample ran on is priced as measured; on other declared hardware (a preset or
    :class:`HardwareSpec` figures) as a roofline projection, a range; with neither, not at all.
    Example, a 2-GPU H200 host::

        NodeOption(name="2x H200", hourly_usd=7.0, gpus_per_node=2, hardware="h200")
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    hourly_usd: float = Field(ge=0.0)
    nodes: int = Field(default=1, ge=1, le=64)
    gpus_per_node: int = Field(default=1, ge=1, le=16, description="GPUs in each node (a DGX Spark: 1).")
    memory_gb: float | None = Field(default=None, gt=0.0, description="Memory per GPU; None = the hardware's "
                                    "(a DGX Spark: its 128 GB, unified; an H200: 141), else 128.")
    hardware: str | HardwareSpec | None = Field(
        default=None, description=f"A preset ({', '.join(PRESETS)}), figures (HardwareSpec), or "
        f"{THIS_MACHINE!r} (the machine the sample ran on, at its measured speed); None = unknown: not priced.",
    )

    @field_validator("hardware")
    @classmethod
    def _known_preset(cls, value: str | HardwareSpec | None) -> str | HardwareSpec | None:
        if isinstance(value, str) and value not in PRESETS and value != THIS_MACHINE:
            raise ValueError(f"unknown hardware preset {value!r}: choose from {[*PRESETS, THIS_MACHINE]} or "
                             "give HardwareSpec(memory_bandwidth_gbs=..., bf16_tflops=..., memory_gb=...)")
        return value

    @property
    def figures(self) -> HardwareSpec | None:
        """The declared hardware's figures (None for no hardware and for ``this-machine``)."""
        return PRESETS.get(self.hardware) if isinstance(self.hardware, str) else self.hardware

    @property
    def gpu_memory_gb(self) -> float:
        """Memory per GPU for placement: ``memory_gb``, else the hardware's, else 128."""
        figures = self.figures
        return self.memory_gb or (figures.memory_gb if figures else 128.0)


class EstimateSpec(Checked):
    """How ``sparkbatch estimate`` samples, prices and compares models for a job.

    Example::

        JobSpec(..., estimate=EstimateSpec(sample_rows=100, models=["gemma-3-270m"], accuracy_bar=0.3))

    The chosen model is the cheapest (predicted cost of the whole job, engine start included, on
    its cheapest node option) whose accuracy interval clears ``accuracy_bar``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _owner: ClassVar[str] = "estimate"

    sample_rows: int = Field(default=80, ge=10, le=100_000, description="Rows timed on the real engine.")
    fill_batch: bool = Field(
        default=True, description="Time at least one full batch (max_num_seqs rows): a smaller sample leaves "
        "the engine part idle and overstates the time (H200: +38% at 80 rows, +2.5% at 1024).",
    )
    min_sample_seconds: float = Field(
        default=5.0, ge=0.0, le=3600.0, description="While the timed rows took less than this, more rows "
        "(the sample doubled, new rows, same engine) are timed, up to a quarter of the job: on an H200 one "
        "batch of short prompts takes under a second, and two such samples of one job were -2% and +28% off. "
        "0: no time floor.",
    )
    strata: int = Field(default=5, ge=1, le=100, description="Input-length bands the sample is spread over.")
    warmup_rows: int = Field(default=8, ge=0, le=10_000, description="Untimed rows run first (other rows).")
    seed: int = 0
    options: list[NodeOption] = Field(min_length=1, default_factory=lambda: [
        NodeOption(name="1 node", hourly_usd=0.79, nodes=1, hardware="dgx-spark"),
        NodeOption(name="2-node cluster", hourly_usd=1.79, nodes=2, hardware="dgx-spark"),
    ])
    models: list[str | ModelCandidate] = Field(
        default_factory=list, description="Candidates compared with the configured model: a model, or a model "
        "with engine settings ('/models/qwen-8b@quantization=fp8', or ModelCandidate).",
    )
    hourly_rate_usd: float | None = Field(
        default=None, ge=0.0, description="Price per hour of the machine the sample runs on: adds the option "
        "'this machine', priced at the measured speed.",
    )
    sample_hardware: str | None = Field(
        default=None, description="What kind of machine the sample runs on (a hardware preset, or 'cpu'); "
        "None = detected from this machine's GPU. Set it when the engine is a server elsewhere.",
    )
    accuracy_bar: float = Field(
        default=0.0, ge=0.0, le=1.0, description="Least accuracy a model needs: the LOWER bound of its 95% "
        "(Wilson) interval on the sample must reach it.",
    )
    max_sample_rows: int = Field(
        default=400, ge=10, le=100_000, description="While a model's accuracy interval straddles accuracy_bar, "
        "its sample is doubled (new rows, same engine) up to this many rows; no growth when sample_rows is "
        "already at or above it.",
    )
    hosted_prices: list[HostedPrice] = Field(
        default_factory=list, description="Your table of hosted batch API prices (USD per million input and "
        "output tokens), or the path of a YAML/CSV file of it: the estimate prices the job's measured tokens "
        "at each, beside the box's options. No price is built in.",
    )

    @field_validator("hosted_prices", mode="before")
    @classmethod
    def _price_table(cls, value: Any) -> Any:
        # A path (the CLI's --hosted-prices, a launchpad string, YAML) is read here: checked like a list.
        return load_hosted_prices(value) if isinstance(value, (str, Path)) else value

    @field_validator("hosted_prices")
    @classmethod
    def _one_row_per_offer(cls, value: list[HostedPrice]) -> list[HostedPrice]:
        return check_table(value)

    @field_validator("models", mode="before")
    @classmethod
    def _parse_candidates(cls, value: Any) -> Any:
        # 'model@key=value' strings (CLI, launchpad, YAML) become candidates with engine settings.
        if not isinstance(value, list):
            return value
        return [ModelCandidate.parse(v) if isinstance(v, str) and "@" in v else v for v in value]

    @field_validator("sample_hardware")
    @classmethod
    def _known_kind(cls, value: str | None) -> str | None:
        if value is not None and value not in {*PRESETS, "cpu", "gpu"}:
            raise ValueError(f"unknown sample_hardware {value!r}: choose from {[*PRESETS, 'cpu', 'gpu']}")
        return value

    def candidates(self) -> list[ModelCandidate]:
        """``models`` as candidates (a plain model name is one without engine settings)."""
        return [m if isinstance(m, ModelCandidate) else ModelCandidate(model=m) for m in self.models]
