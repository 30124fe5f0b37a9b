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
import re
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .answer import OutputSpec, SamplingSpec
from .cascade import CascadeStage, check_cascade
from .checked import Checked, fingerprint, no_written_secret
from .estimate_spec import EstimateSpec
from .review import ReviewSpec, check_review
from .sink import SinkSpec


def _is_url(location: str | None) -> bool:
    """An object-store URL (s3://, gs://, ...), not a path or file://."""
    return bool(location) and "://" in str(location) and not str(location).startswith("file://")


#: Input formats that are provider batch files: every line its own request (spec/batch_requests.py).
BATCH_INPUTS = ("openai_batch", "anthropic_batch")

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class JobSpec(Checked):
    """A batch job: one fixed prompt over every row of an input.

    Attributes are validated on construction; a bad value raises :class:`ConfigError`
    naming the field and the fix.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _owner: ClassVar[str] = "JobSpec"

    name: str = Field(description="Job name: lowercase letters, digits, '_'. Used in asset keys.")
    input: str = Field(description="Path, glob or fsspec URL of Parquet, CSV or JSONL files.")
    input_format: Literal["auto", "parquet", "csv", "json", "arrow", "openai_batch", "anthropic_batch"] = Field(
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
    checkpoint_rows: int = Field(default=4096, ge=1, description="Flush finished rows every N rows...")
    checkpoint_seconds: float = Field(default=5.0, gt=0.0, description="...or every T seconds.")
    max_error_rate: float = Field(default=0.05, ge=0.0, le=1.0, description="Asset check bar.")
    review_below: float = Field(
        default=0.5, description="Answers whose confidence is under this (0 < x <= 1) are listed, least sure "
        "first, in the `review` view for a person to check (`sparkbatch sql -f ... \"FROM review\"`). Changes "
        "only that view: not the output version, not the stored answers.",
    )
    review: ReviewSpec | None = Field(
        default=None, description="The review threshold from the gold rows instead of review_below: {budget: "
        "0.1} (share of rows reviewed) or {catch_errors: 0.8} (share of errors caught), exactly one "
        "(spec/review.py); analytics turns it into the `review` view's threshold on the calibrated confidences. "
        "Like review_below it reads rows only: not the output version, not the stored answers.",
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
        return no_written_secret(v, "storage_options", "s3fs and gcsfs read AWS_* / GOOGLE_* variables themselves")

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
        check_review(self.review, "review_below" in self.model_fields_set, self.gold_column, self.output.kind,
                     self.output.confidence)
        if self.input_format in BATCH_INPUTS and (self.output.kind != "text" or self.cascade or self.system_prompt
                                                  or self.gold_column):
            raise ValueError(f"input_format={self.input_format!r}: each line sets its own prompt and output "
                             "(response_format): leave output, system_prompt, gold_column and cascade unset")
        if self.input_format not in BATCH_INPUTS and (self.sampling.n > 1 or self.sampling.logprobs is not None):
            # A row keeps one answer and no token log-probabilities: more would be generated and thrown away.
            raise ValueError(f"sampling.n={self.sampling.n}, sampling.logprobs={self.sampling.logprobs}: a row keeps "
                             "one answer, and its confidence is the output's own (output.confidence); further "
                             "choices and token log-probabilities are a batch file line's (input_format "
                             "openai_batch): leave n at 1 and logprobs unset")
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


