"""The job spec: what to read, how to prompt, what to produce, and what it costs.

A spec is plain, validated data. Everything downstream (sharding, rendering, the engine,
checkpoints, metrics) reads it and nothing else, so a spec fully describes a job.

Example::

    spec = JobSpec(
        name="tickets",
        input="data/tickets/*.parquet",
        id_column="ticket_id",
        text_columns=["subject", "body"],
        user_template="Subject: {{ subject }}\\n{{ body }}\\nWhich team should handle it?",
        output=OutputSpec(kind="label", labels=["billing", "tech", "sales"]),
        gold_column="team",
    )
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError
from .cascade import CascadeStage, check_cascade
from .hardware import PRESETS, THIS_MACHINE, HardwareSpec, ModelCandidate
from .hosted import HostedPrice, check_table, load_hosted_prices
from .sink import SinkSpec

#: storage_options keys that hold a secret: only by reference (EnvVar / {env: NAME}).
_SECRET_KEYS = {"key", "secret", "token", "password", "aws_secret_access_key", "aws_access_key_id",
                "aws_session_token", "session_token", "account_key", "sas_token", "client_secret"}


def _is_url(location: str | None) -> bool:
    """An object-store URL (s3://, gs://, ...), not a path or file://."""
    return bool(location) and "://" in str(location) and not str(location).startswith("file://")


#: Input formats that are provider batch files: every line its own request (spec/batch_requests.py).
BATCH_INPUTS = ("openai_batch", "anthropic_batch")

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class _Checked(BaseModel):
    """Settings whose validation errors become a :class:`ConfigError` naming field and fix."""

    _owner: ClassVar[str] = "settings"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, self._owner)) from None


class OutputSpec(BaseModel):
    """What the model must produce for each row.

    - ``label``: exactly one of ``labels``, enforced by vLLM structured outputs.
    - ``json``: an object matching ``json_schema``, enforced the same way.
    - ``text``: free text, optionally constrained by ``regex``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["label", "json", "text"] = "text"
    labels: list[str] = Field(default_factory=list, description="Allowed labels (kind='label').")
    json_schema: dict[str, Any] | None = Field(default=None, description="JSON schema (kind='json').")
    regex: str | None = Field(default=None, description="Optional regex for kind='text'.")
    confidence: bool = Field(default=True, description=(
        "Give each label or JSON row a confidence from the engine's log-probabilities (docs/labels.md). "
        "Off: no log-probabilities are asked (they cost time on a fast GPU) and the column is null. It does "
        "not change the answers, so it is not part of the output version."))
    keep_reasoning: bool = Field(
        default=False, description="With sampling.reasoning on: keep each answer's thinking text in a `reasoning` "
        "column (and in the result store, so a reused answer keeps it). Off: only its token count is kept.",
    )

    @model_validator(mode="after")
    def _check_kind(self) -> OutputSpec:
        if self.kind == "label":
            if len(self.labels) < 2:
                raise ValueError("output.kind='label' needs at least two labels: set output.labels")
            if len(set(self.labels)) != len(self.labels):
                raise ValueError("output.labels has duplicates: list each label once")
        if self.kind == "json" and not self.json_schema:
            raise ValueError("output.kind='json' needs output.json_schema (a JSON schema dict)")
        if self.regex is not None:
            re.compile(self.regex)
        return self

    def identity(self) -> dict[str, Any]:
        """What of the spec shapes an answer (the fingerprints'): all but ``confidence``, and
        ``keep_reasoning`` only when on (so the versions of jobs written before it existed stay
        what they were)."""
        data = self.model_dump(exclude={"confidence"})
        if not self.keep_reasoning:
            data.pop("keep_reasoning")
        return data


class SamplingSpec(BaseModel):
    """Sampling settings; part of the fingerprint, so changing them starts a new output version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int = 0
    ignore_eos: bool = Field(default=False, description="Always generate max_tokens (benchmarks).")
    reasoning: Literal["off", "auto"] | int = Field(
        default="off", description="A reasoning model's thinking: 'off' (the chat template's default prompt, the "
        "grammar from the first token), a budget in tokens (the model thinks at most that long, then answers under "
        "the grammar), or 'auto' (a budget of 1024 when the chat template thinks, else off). max_tokens counts the "
        "thinking too: it must hold the budget plus the answer. docs/reasoning.md.",
    )

    @field_validator("reasoning")
    @classmethod
    def _check_reasoning(cls, value: str | int) -> str | int:
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"reasoning={value} must be 'off', 'auto' or a thinking budget of at least 1 token "
                             "(e.g. 512)")
        return value

    @model_validator(mode="after")
    def _check_room(self) -> SamplingSpec:
        budget = self.reasoning
        if isinstance(budget, int) and self.max_tokens < budget + 2:
            raise ValueError(f"max_tokens={self.max_tokens} cannot hold the thinking budget reasoning={budget} plus "
                             f"the end of the thinking and an answer: raise max_tokens to at least {budget + 2} "
                             f"plus the answer's length (e.g. {budget + 64}), or lower reasoning")
        return self

    def identity(self) -> dict[str, Any]:
        """What names the output version: every field, ``reasoning`` only when on (so the
        versions of jobs written before it existed stay what they were)."""
        data = self.model_dump()
        if self.reasoning == "off":
            data.pop("reasoning")
        return data


class NodeOption(BaseModel):
    """One way to rent the box. ``hourly_usd`` is the price of all ``nodes`` together; the
    estimate prices a model only on options whose GPUs hold it, and says how to run each
    (``sparkbatch_dagster.placement``). ``hardware`` says what the speed is: an option on the kind
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


class EstimateSpec(_Checked):
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


class JobSpec(_Checked):
    """A batch job: one fixed prompt over every row of an input.

    Attributes are validated on construction; a bad value raises :class:`ConfigError`
    naming the field and the fix.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _owner: ClassVar[str] = "JobSpec"

    name: str = Field(description="Job name: lowercase letters, digits, '_'. Used in asset keys.")
    input: str = Field(description="Path, glob or fsspec URL of Parquet, CSV or JSONL files.")
    input_format: Literal["auto", "parquet", "csv", "json", "openai_batch", "anthropic_batch"] = Field(
        default="auto", description="auto: from the file name. openai_batch / anthropic_batch: a provider's batch "
        "file, each line its own request (docs/batch-files.md); the job's template is then each row's messages.",
    )
    csv_delimiter: str | None = Field(
        default=None, min_length=1, max_length=1, description="CSV field delimiter; None lets DuckDB detect it."
    )
    id_column: str | None = Field(
        default=None, description="Column with a unique row id; None generates ids by input order."
    )
    text_columns: list[str] = Field(description="Columns the template may use.")
    system_prompt: str = ""
    user_template: str = Field(description="Jinja template rendered in a sandbox, one per row.")
    output: OutputSpec = Field(default_factory=OutputSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    shard_count: int | None = Field(default=None, ge=1, le=100_000)
    shard_size: int | None = Field(default=None, ge=1, description="Rows per shard (approximate).")
    gold_column: str | None = Field(default=None, description="Column holding the right answer.")
    hourly_rate_usd: float = Field(default=0.79, ge=0.0, description="Price of the box per hour.")
    home: str | None = Field(
        default=None, description="Folder or object-store URL (s3://bucket/prefix, gs://...) for shards, outputs, "
        "metrics; None = .sparkbatch/<name>, one per job. A URL is the truth and a local folder its cache.",
    )
    result_store: str | None = Field(
        default=None, description="Folder or object-store URL of stored answers, reused by every run; None = "
        "<home>/results. Point several jobs at one place to share answers between them.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict, repr=False, description="fsspec options of a URL home/result_store (e.g. endpoint_url, "
        "profile). Secrets by reference only: a Dagster EnvVar or {env: NAME}, read at connect time.",
    )
    cache_dir: str | None = Field(
        default=None, description="Local cache of a URL home; None = .sparkbatch/cache/<name>. Deletable any time "
        "no run uses it.",
    )
    lease_seconds: float = Field(
        default=60.0, ge=1.0, description="URL home: a shard's lease length; a box that dies holds its shards "
        "this long, then another takes them over.",
    )
    max_input_chars: int = Field(default=20_000, ge=1, description="Longer texts become error rows.")
    checkpoint_rows: int = Field(default=256, ge=1, description="Flush finished rows every N rows...")
    checkpoint_seconds: float = Field(default=5.0, gt=0.0, description="...or every T seconds.")
    max_error_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="Asset check bar.")
    review_below: float = Field(
        default=0.5, description="Answers whose confidence is under this (0 < x <= 1) are listed, least sure "
        "first, in the `review` view for a person to check (`sparkbatch sql -f ... \"FROM review\"`). Changes "
        "only that view: not the output version, not the stored answers.",
    )
    cascade: list[CascadeStage] = Field(
        default_factory=list, description="Models in turn: the first answers every row, each next one the rows "
        "the one before was less sure of than its `below` (spec/cascade.py). Empty = the configured model alone.",
    )
    estimate: EstimateSpec = Field(default_factory=EstimateSpec, description="`sparkbatch estimate` settings.")
    max_cost_usd: float | None = Field(
        default=None, ge=0.0, description="Brake: a run refuses to generate when the predicted bill of the "
        "version (every attempt, at hourly_rate_usd) exceeds it, and stops cleanly when the measured rate says it "
        "will; None = no cap.",
    )
    deadline: datetime | None = Field(
        default=None, description="Brake: when the rental ends (a time with its zone, e.g. "
        "2026-12-01T18:00:00+00:00); a run stops cleanly early enough to commit. None = no deadline.",
    )
    sink: SinkSpec | None = Field(
        default=None, description="The labeled rows as a Delta Lake table too, kept in step with the commits by "
        "analytics (docs/table-sink.md): {format: delta, uri: ..., storage_options: ...}. None = no table.",
    )

    @model_validator(mode="before")
    @classmethod
    def _batch_file_defaults(cls, data: Any) -> Any:
        """A provider batch file brings its own prompts: the row id is its ``custom_id`` and its one
        text column the normalized request (``inputs/batch_input.py``), which only these values read."""
        if isinstance(data, dict) and data.get("input_format") in BATCH_INPUTS:
            fixed = {"id_column": "custom_id", "text_columns": ["request"], "user_template": "{{ request }}"}
            wrong = sorted(k for k, v in fixed.items() if data.get(k) not in (None, v))
            if wrong:
                raise ValueError(f"input_format={data['input_format']!r} sets {wrong[0]} itself (to "
                                 f"{fixed[wrong[0]]!r}): leave {wrong} out; each line's messages are its prompt")
            data = {**data, **fixed, "max_input_chars": data.get("max_input_chars", 1_000_000)}
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(f"name={v!r} must match [a-z][a-z0-9_]*, e.g. 'debian_sections'")
        return v

    @field_validator("text_columns")
    @classmethod
    def _check_text_columns(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("text_columns is empty: name at least one input column")
        return v

    @field_validator("storage_options")
    @classmethod
    def _check_storage_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        secret = sorted(k for k, x in v.items() if k.lower() in _SECRET_KEYS and isinstance(x, str)
                        and type(x).__name__ != "EnvVar")
        if secret:
            raise ValueError(f"storage_options[{secret[0]!r}] is a secret written in the spec: pass it by reference, "
                             f"{secret[0]}: {{env: MY_VAR}} in YAML or EnvVar('MY_VAR') in Python (or leave it out: "
                             "s3fs and gcsfs read AWS_* / GOOGLE_* variables themselves)")
        return v

    @field_validator("review_below")
    @classmethod
    def _check_review_below(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:  # NaN fails too
            raise ValueError(f"review_below={v!r} must be above 0 and at most 1: a confidence, e.g. 0.5 (rows "
                             "whose answer's confidence is under it go to the `review` view)")
        return v

    @field_validator("deadline")
    @classmethod
    def _check_deadline(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.utcoffset() is None:
            raise ValueError(f"deadline={v.isoformat()} has no time zone: write it with one, e.g. "
                             f"{v.isoformat()}+00:00")
        return v

    @model_validator(mode="after")
    def _check_shards(self) -> JobSpec:
        if self.shard_count is not None and self.shard_size is not None:
            raise ValueError("set shard_count or shard_size, not both")
        from .prompts import check_template  # local: prompts imports jinja2 only when needed

        check_template(self.user_template, self.text_columns, "user_template")
        check_template(self.system_prompt, self.text_columns, "system_prompt")
        check_cascade(self.cascade, self.output.kind, self.output.confidence)
        if self.input_format in BATCH_INPUTS and (self.output.kind != "text" or self.cascade or self.system_prompt
                                                  or self.gold_column):
            raise ValueError(f"input_format={self.input_format!r}: each line sets its own prompt and output "
                             "(response_format): leave output, system_prompt, gold_column and cascade unset")
        if self.input_format in BATCH_INPUTS and self.sampling.reasoning != "off":
            # A line's own settings would bypass the thinking's bound (the reasoning loop takes the job's).
            raise ValueError(f"input_format={self.input_format!r} with sampling.reasoning="
                             f"{self.sampling.reasoning!r}: a batch file's lines are not run as reasoning requests "
                             "yet; leave sampling.reasoning 'off' (a line's max_tokens then holds any thinking)")
        return self

    @property
    def home_url(self) -> str | None:
        """The object-store URL of the home, or None for a folder."""
        return self.home.rstrip("/") if _is_url(self.home) and self.home else None

    @property
    def home_path(self) -> Path:
        """The job's local folder (with a URL home, its cache). The default is per job name, so two
        jobs never share files."""
        if self.home_url:
            return Path(self.cache_dir or Path(".sparkbatch") / "cache" / self.name).expanduser().resolve()
        return Path((self.home or "").removeprefix("file://") or Path(".sparkbatch") / self.name).expanduser().resolve()

    @property
    def result_store_url(self) -> str | None:
        """The answer store's object-store URL (its own, or <home URL>/results), or None."""
        if self.result_store:
            return self.result_store.rstrip("/") if _is_url(self.result_store) else None
        return f"{self.home_url}/results" if self.home_url else None

    @property
    def result_store_path(self) -> Path:
        """The answer store's local folder (with a URL store, its cache)."""
        if self.result_store and _is_url(self.result_store):
            return self.home_path / f"results-{hashlib.sha256(self.result_store.encode()).hexdigest()[:12]}"
        if self.result_store:
            return Path(self.result_store.removeprefix("file://")).expanduser().resolve()
        return self.home_path / "results"

    def answer_context(self, model: str) -> str:
        """Everything besides the rendered prompt that determines a generated answer: the
        model identity, sampling and the output spec. Names the result store's folder."""
        return fingerprint({"model": model, "output": self.output.identity(), "sampling": self.sampling.identity()})

    def shards_for(self, rows: int) -> int:
        """Number of shards for an input of ``rows`` rows."""
        if self.shard_count is not None:
            return self.shard_count
        size = self.shard_size or 10_000
        return max(1, -(-rows // size))

    def prompt_fingerprint(self) -> str:
        """Hash of everything that shapes an output row except the model and the input (not
        what only reads the rows, e.g. ``review_below``: changing it labels nothing again)."""
        payload = {
            "system": self.system_prompt,
            "user": self.user_template,
            "text_columns": self.text_columns,
            "output": self.output.identity(),
            "sampling": self.sampling.identity(),
            "max_input_chars": self.max_input_chars,
        }
        if self.input_format in BATCH_INPUTS:  # only then, so the fingerprints of existing jobs stay as they are
            payload["input_format"] = self.input_format
        return fingerprint(payload)


def fingerprint(payload: Any) -> str:
    """A short stable hash of JSON-serializable data."""
    raw = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _explain(exc: ValidationError, owner: str) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "spec"
        msg = str(err["msg"]).removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"{owner}.{where}: {msg}{shown}")
    return f"invalid {owner} settings:\n  " + "\n  ".join(lines)
