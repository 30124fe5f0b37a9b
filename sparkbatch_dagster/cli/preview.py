"""See before you pay: what a job would send to the engine, without starting one.

Each shard is planned exactly as a run plans it (row checks, rendering, exact-duplicate
grouping, the result-store lookup), so the counts are what a run would generate; a few
prompts are shown as the model would see them (its chat template applied by its tokenizer,
no engine) with their token counts.

Example::

    report = preview(job, VLLMResource(), show=3)
    report.shards[0].to_generate, report.prompts[0].text, report.to_json()   # the JSON the CLI prints
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..engines.answers import reasoning
from ..errors import ConfigError
from ..run.result_store import open_store
from ..run.rows import in_prefix_order, plan_rows, read_shard, store_key
from ..spec.prompts import chat_text


class ShardPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One shard planned as a run plans it: its rows, those that are errors before any engine,
    its distinct prompts (and the duplicate rows they answer), those the result store holds."""

    partition: str
    rows: int
    error_rows: int
    distinct_prompts: int
    duplicate_rows: int
    stored_prompts: int
    to_generate: int


class PromptShown(msgspec.Struct, frozen=True, kw_only=True):
    """A prompt to generate as the model sees it: its messages, the text its chat template makes
    of them, and its tokens (None without a local tokenizer)."""

    partition: str
    row_ids: list[str]
    rows: int
    messages: list[dict[str, str]]
    text: str
    tokens: int | None


class Preview(msgspec.Struct, frozen=True, kw_only=True):
    """What a run would send to the engine: every shard's plan and their totals, a few prompts."""

    job: str
    model: str
    dtype: str
    dtype_reason: str
    chat_template: bool
    tokenizer: bool
    rows: int
    error_rows: int
    distinct_prompts: int
    duplicate_rows: int
    stored_prompts: int
    to_generate: int
    shards: list[ShardPlan]
    prompts: list[PromptShown]
    warnings: list[str]

    def to_json(self) -> dict[str, Any]:
        """The JSON line ``sparkbatch preview`` prints."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def load_tokenizer(path: str) -> Any | None:
    """The model's own tokenizer (transformers only, no engine); None when there is none here
    (a server someone else runs, a hub name without a local copy, the fake engine)."""
    if not (Path(path) / "tokenizer_config.json").exists():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@contextlib.contextmanager
def planning_home(job: Any) -> Iterator[Any]:
    """Where a preview reads its shards: the job's home when they are the input's current ones,
    else a scratch folder sharded here and deleted after. A preview changes nothing: not the
    home, not the bucket, not a run's shards (a changed input is sharded for real by
    ``input_shards`` or ``sparkbatch run``)."""
    from ..home import JobHome
    from ..inputs.shards import build_shards, input_signature

    home = job.home
    home.refresh()
    manifest = home.read_manifest()
    if manifest and manifest.get("signature") == input_signature(job.spec) and all(
            home.shard_path(k).exists() for k in manifest["keys"]):
        yield home
        return
    with tempfile.TemporaryDirectory(prefix="sparkbatch-preview-") as tmp:
        scratch = JobHome(Path(tmp), results=home.results or job.spec.result_store_path,
                          results_remote=home.results_remote)
        build_shards(job.spec, scratch)
        yield scratch


def preview(job: Any, resource: Any, show: int = 5, home: Any = None) -> Preview:
    """Plan every shard of ``job`` as a run would; render the first ``show`` prompts to generate.
    ``home``: where the shards are (:func:`planning_home`); the job's own by default."""
    spec, home = job.spec, home or job.home
    manifest = home.read_manifest() or {"keys": [], "signature": None}
    from ..definitions.cascade import model_identity

    model = model_identity(spec, resource)
    store = open_store(spec, home, model)
    shards: list[ShardPlan] = []
    samples: list[tuple[str, list[dict[str, str]], list[str]]] = []
    for key in manifest["keys"]:
        rows = read_shard(home, key, manifest["signature"])
        errors, groups = plan_rows(spec, rows, set())
        stored = store.lookup([k for g in groups if (k := store_key(g)) is not None])
        todo = in_prefix_order({g: v for g, v in groups.items() if store_key(g) not in stored})
        shards.append(ShardPlan(partition=key, rows=len(rows), error_rows=len(errors), distinct_prompts=len(groups),
                                duplicate_rows=sum(len(ids) - 1 for _, ids in groups.values()),
                                stored_prompts=len(groups) - len(todo), to_generate=len(todo)))
        samples += [(key, groups[g][0].messages(), groups[g][1]) for g in todo[: max(0, show - len(samples))]]
    path = resource.model_name()
    tokenizer = load_tokenizer(path)
    thinking = _thinking_kwargs(tokenizer, spec)
    prompts = []
    for key, messages, ids in samples:
        text, special = chat_text(tokenizer, messages, thinking) if tokenizer else (
            "\n\n".join(m["content"] for m in messages), True)
        tokens = len(tokenizer(text, add_special_tokens=special)["input_ids"]) if tokenizer else None
        prompts.append(PromptShown(partition=key, row_ids=ids[:3], rows=len(ids), messages=messages, text=text,
                                   tokens=tokens))
    dtype, why = resource.dtype_choice()
    return Preview(job=spec.name, model=model, dtype=dtype, dtype_reason=why,
                   chat_template=bool(tokenizer and tokenizer.chat_template), tokenizer=tokenizer is not None,
                   rows=sum(s.rows for s in shards), error_rows=sum(s.error_rows for s in shards),
                   distinct_prompts=sum(s.distinct_prompts for s in shards),
                   duplicate_rows=sum(s.duplicate_rows for s in shards),
                   stored_prompts=sum(s.stored_prompts for s in shards),
                   to_generate=sum(s.to_generate for s in shards), shards=shards, prompts=prompts,
                   warnings=label_warnings(spec, tokenizer) + reasoning_warnings(spec, tokenizer))


def label_warnings(spec: Any, tokenizer: Any | None) -> list[str]:
    """A label longer (in the model's tokens) than ``max_tokens`` could never be answered whole."""
    if tokenizer is None or spec.output.kind != "label":
        return []
    longest = max(spec.output.labels, key=lambda label: len(tokenizer(label, add_special_tokens=False)["input_ids"]))
    tokens = len(tokenizer(longest, add_special_tokens=False)["input_ids"])
    if tokens <= spec.sampling.max_tokens:
        return []
    return [f"sampling.max_tokens={spec.sampling.max_tokens} is below the longest label's {tokens} tokens "
            f"({longest!r}): its answers would be cut and become error rows; raise sampling.max_tokens to {tokens}"]


def _thinking_kwargs(tokenizer: Any | None, spec: Any) -> dict[str, Any] | None:
    """The template variables a run renders with (a reasoning job's ``enable_thinking``)."""
    if tokenizer is None:
        return None
    with contextlib.suppress(ConfigError):  # a plan that cannot run: reasoning_warnings says why
        plan = reasoning.plan(tokenizer, spec.sampling)
        return plan.template_kwargs if plan else None
    return None


def reasoning_warnings(spec: Any, tokenizer: Any | None) -> list[str]:
    """A chat template that thinks by default: whether ``max_tokens`` holds the thinking budget
    plus the answer (with reasoning off, whether the grammar's first token lands in the thinking);
    and a reasoning setting this model cannot run (``engines/answers/reasoning.py``)."""
    if tokenizer is None:
        return []
    sampling = spec.sampling
    thinks = reasoning.thinks_by_default(tokenizer)
    if sampling.reasoning == "off":
        if not thinks:
            return []
        room = reasoning.AUTO_BUDGET + 1 + _answer_tokens(spec, tokenizer)
        raise_to = f" with sampling.max_tokens at least {room}" if sampling.max_tokens < room else ""
        return [f"the chat template thinks by default, but sampling.reasoning is 'off': the answer's grammar applies "
                f"from the first token, where the model would think; set sampling.reasoning to 'auto' (a budget of "
                f"{reasoning.AUTO_BUDGET}){raise_to}, or a budget of your own"]
    try:
        plan = reasoning.plan(tokenizer, sampling)
    except ConfigError as exc:
        return [str(exc)]
    if plan is None:
        return []
    need = plan.budget + 1 + _answer_tokens(spec, tokenizer)
    if sampling.max_tokens >= need:
        return []
    return [f"sampling.max_tokens={sampling.max_tokens} cannot hold the thinking budget ({plan.budget}) plus the end "
            f"of the thinking and the longest answer ({need - plan.budget - 1} tokens): answers would be cut; raise "
            f"sampling.max_tokens to {need} or lower sampling.reasoning"]


def _answer_tokens(spec: Any, tokenizer: Any) -> int:
    """The longest label's tokens (a label job), else 1: the least an answer needs."""
    if spec.output.kind != "label":
        return 1
    return max(len(tokenizer(label, add_special_tokens=False)["input_ids"]) for label in spec.output.labels)


def describe(report: Preview) -> list[str]:
    """Human lines for stderr: the prompts as the model sees them, then the counts."""
    lines = []
    for n, p in enumerate(report.prompts, 1):
        tokens = f"{p.tokens} tokens" if p.tokens is not None else "tokens unknown (no local tokenizer)"
        lines += [f"--- prompt {n} ({p.partition}, {p.rows} row(s): {', '.join(p.row_ids)}; {tokens}) ---", p.text]
    template = "its chat template" if report.chat_template else "no chat template (plain text)"
    lines.append(f"--- {report.job} on {report.model} ({template}) ---")
    lines.append(f"dtype: {report.dtype}, {report.dtype_reason}")
    for s in report.shards:
        lines.append(f"{s.partition}: {s.rows} rows, {s.distinct_prompts} distinct prompts "
                     f"({s.duplicate_rows} duplicate rows), {s.error_rows} error rows, "
                     f"{s.stored_prompts} already answered, {s.to_generate} to generate")
    lines.append(f"total: {report.rows} rows; {report.to_generate} prompts to generate, "
                 f"{report.stored_prompts} already answered in the result store")
    return lines + [f"warning: {w}" for w in report.warnings]
