"""One row's way through a run: checked and rendered into a prompt (or an error row), its
answer parsed against the declared output (:class:`Answer`: what the prompt got, shared by every
row with that prompt), and the output row that records it (:func:`row`)::

    answer = Answer.of_engine(res, spec, prompt, key, model)
    writer.add(row(row_id, version, answer, duplicate=False))
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from ..engines.base import EngineResult
from ..errors import ConfigError, SparkbatchError
from ..home import JobHome
from ..spec import BATCH_INPUTS, JobSpec, OutputSpec
from ..spec.batch_prompt import RequestPrompt, request_prompt
from ..spec.prompts import RenderedPrompt, check_text, render
from .records import OutputRow

#: Row errors that the same prompt under the same settings would get again: stored for reuse.
#: Anything else (a sporadic HTTP 400) is retried by a later version instead of remembered.
STORED_ERRORS = ("prompt_too_long", "bad_output")


def parse_output(text: str, spec: JobSpec, own: OutputSpec | None = None) -> tuple[str | None, str | None]:
    """(output, error) for one generated text, checked against the declared output kind (``own``:
    the row's own, a batch file line's ``response_format``)."""
    declared = own or spec.output
    kind = declared.kind
    if kind == "label":
        label = text.strip()
        if label in declared.labels:
            return label, None
        return None, f"bad_output: {label[:80]!r} is not one of the declared labels"
    if kind == "json":
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"bad_output: not valid JSON ({exc.msg} at char {exc.pos})"
        # An array where the schema makes one (a batch line's forced tool calls: ``spec.batch_tools``).
        wanted = list if (declared.json_schema or {}).get("type") == "array" else dict
        if not isinstance(value, wanted):
            return None, f"bad_output: expected a JSON {'array' if wanted is list else 'object'}, got " \
                         f"{type(value).__name__}"
        return json.dumps(value, sort_keys=True), None
    if declared.regex and not re.fullmatch(declared.regex, text):
        return None, f"bad_output: {text[:80]!r} does not match the output regex"
    return text, None


def outcome(res: EngineResult, spec: JobSpec, prompt: Any = None) -> tuple[str | None, str | None, bool]:
    """(output, error, truncated) of one engine result.

    An answer that hit ``max_tokens`` is cut unless it is whole anyway: a declared label or a
    JSON object that parses is (the engine stopped at the limit before its end-of-text token,
    with nothing left to say). A cut label or JSON is an error row, ``truncated`` (half a label
    is no label); a cut text keeps its text, marked ``truncated``. ``prompt``: the row's prompt,
    whose own output and sampling (a batch file line's) count instead of the job's. A batch
    file's line keeps a cut answer of any kind, as the providers' APIs return it (OpenAI: 200 with
    ``finish_reason: "length"``; Anthropic: ``stop_reason: "max_tokens"``), not as an error.
    """
    if res.error is not None or res.text is None:
        return None, res.error, False
    own: OutputSpec | None = getattr(prompt, "output", None)
    kind = (own or spec.output).kind
    output, error = parse_output(res.text, spec, own)
    if res.finish_reason != "length" or (error is None and kind != "text"):
        return output, error, False
    if kind == "text":
        return output, error, True
    if spec.input_format in BATCH_INPUTS:
        return res.text, None, True
    limit = (getattr(prompt, "sampling", None) or spec.sampling).max_tokens
    return None, f"truncated: hit max_tokens={limit}; raise sampling.max_tokens", True


@dataclass(frozen=True)
class Tokens:
    """What one generation cost: prompt, output (thinking included), prompt tokens served from
    the prefix cache, and the thinking's own."""

    prompt: int = 0
    output: int = 0
    cached: int = 0
    reasoning: int = 0


NO_TOKENS = Tokens()


@dataclass(frozen=True)
class Answer:
    """What one prompt got, shared by every row with that prompt: the engine's answer
    (:meth:`of_engine`), the result store's (:meth:`stored`), or none (:meth:`failed`: an input
    error). ``confidence`` is the answer's, kept on a row only when it has an output;
    ``reasoning`` only when the job keeps it (``output.keep_reasoning``)."""

    model: str
    output: str | None = None
    error: str | None = None
    prompt_key: str | None = None
    finish_reason: str | None = None
    truncated: bool = False
    reused: bool = False
    confidence: float | None = None
    reasoning: str | None = None
    extra: str | None = None
    tokens: Tokens = NO_TOKENS

    @classmethod
    def of_engine(cls, res: EngineResult, spec: JobSpec, prompt: Any, key: str | None, model: str) -> Answer:
        """An engine result checked against the declared output (``prompt``: the row's own, see
        :func:`outcome`); ``model``: the engine's, unless the result names the one that answered."""
        output, error, cut = outcome(res, spec, prompt)
        return cls(model=res.model or model, output=output, error=error, prompt_key=key,
                   finish_reason=res.finish_reason, truncated=cut, confidence=res.confidence,
                   reasoning=res.reasoning if spec.output.keep_reasoning else None, extra=res.extra,
                   tokens=Tokens(res.prompt_tokens, res.output_tokens, res.cached_tokens, res.reasoning_tokens))

    @classmethod
    def stored(cls, found: tuple[Any, ...], key: str, model: str) -> Answer:
        """The result store's answer (``ResultStore.lookup``'s tuple: output, error, confidence,
        model, reasoning, extra, truncated, finish_reason); its model is the one that gave it (a
        cascade's stage), else ``model``. A cut answer keeps its mark, and an answer says why it ended
        as the engine said it (``length`` for one cut by a store that did not keep the reason)."""
        output, error, confidence, by, reasoning, extra, cut, why = found
        return cls(model=by or model, output=output, error=error, prompt_key=key, reused=True,
                   confidence=confidence, reasoning=reasoning, extra=extra, truncated=bool(cut),
                   finish_reason=why or ("length" if cut else None))

    @classmethod
    def failed(cls, reason: str, model: str) -> Answer:
        """No prompt at all: the row's input was refused (``reason``)."""
        return cls(model=model, error=reason)


def row(row_id: str, version: str, answer: Answer, duplicate: bool = False) -> OutputRow:
    """One output row of ``version`` (its fingerprint) recording ``answer``. ``duplicate``: a row
    after the first with the same prompt (fanned out, ``deduplicated``)."""
    # Tokens are counted once per generation: fanned-out duplicates and reused answers carry zeros.
    tokens = NO_TOKENS if duplicate else answer.tokens
    return OutputRow(
        row_id=row_id, output=answer.output, error=answer.error, prompt_tokens=tokens.prompt,
        output_tokens=tokens.output, cached_tokens=tokens.cached, deduplicated=duplicate, reused=answer.reused,
        prompt_key=answer.prompt_key, fingerprint=version, model=answer.model, finish_reason=answer.finish_reason,
        truncated=answer.truncated,
        # The answer's, on every row that carries it (fanned-out and reused rows too); none on an error row.
        confidence=answer.confidence if answer.output is not None else None,
        reasoning=answer.reasoning, reasoning_tokens=tokens.reasoning,
        extra=answer.extra if answer.output is not None else None,
    )


#: A draw's group: its row's own (a draw is never shared, see :func:`plan_rows`).
DRAW = "draw:"


def plan_rows(spec: JobSpec, rows: list[dict[str, Any]], skip: set[str]
              ) -> tuple[dict[str, str], dict[str, tuple[RenderedPrompt | RequestPrompt, list[str]]]]:
    """Split pending rows into error rows {id: reason} and unique prompts {group: (prompt, ids)}.
    A group is the answer's key (:func:`store_key`): rows whose engine inputs are identical share
    it, and one generation. A draw (temperature above 0, no seed) is a group of its own row, so
    three identical sampled lines are three samples. A batch file's row (``input_format``
    openai_batch / anthropic_batch) is its own request: its prompt is its messages, with its own
    sampling and output, not the job's template."""
    errors: dict[str, str] = {}
    groups: dict[str, tuple[RenderedPrompt | RequestPrompt, list[str]]] = {}
    own = spec.input_format in BATCH_INPUTS
    for row in rows:
        rid = row["row_id"]
        if rid in skip:
            continue
        reason = row.get("_input_error") or next(
            (r for c in spec.text_columns if (r := check_text(row[c], c, spec.max_input_chars))), None
        )
        if reason:
            errors[rid] = reason
            continue
        try:
            prompt: RenderedPrompt | RequestPrompt = request_prompt(row["request"], spec.sampling) if own else \
                render(spec.system_prompt, spec.user_template, {c: row[c] for c in spec.text_columns})
        except ConfigError as exc:
            errors[rid] = f"render_error: {exc}"
            continue
        key = prompt.answer_key(spec.sampling, spec.output)
        groups.setdefault(key or DRAW + rid, (prompt, []))[1].append(rid)
    return errors, groups


def store_key(group: str) -> str | None:
    """The result-store key of a :func:`plan_rows` group; None for a draw (never stored or looked up)."""
    return None if group.startswith(DRAW) else group


def in_prefix_order(groups: dict[str, tuple[Any, list[str]]]) -> list[str]:
    """The groups in the order they go to the engine: prompts that share a prefix next to each
    other (prefix-cache hits), ties by key."""
    return sorted(groups, key=lambda g: (groups[g][0].order, g))


def read_shard(home: JobHome, key: str, signature: str | None) -> list[dict[str, Any]]:
    """A shard's input rows, read from the manifest the run planned with.

    Re-sharding takes the shards lock exclusively; reading under the shared lock, after
    checking the manifest is the one this run's output version was computed from, means rows
    of a new input can never land in the old version's folder.
    """
    with home.shards_lock().held(shared=True):
        current = (home.read_manifest() or {}).get("signature")
        if signature is not None and current != signature:
            raise SparkbatchError(
                f"the input was sharded again while this run was labeling (manifest {current}, run planned on "
                f"{signature}): run again; rows already finished are kept"
            )
        return list(pq.read_table(home.shard_path(key)).to_pylist())
