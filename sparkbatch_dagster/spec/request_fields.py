"""Every sampling field of a request, declared once: its name here (``SamplingSpec``'s), OpenAI's
and Anthropic's names for it, its type, whether it is part of an answer's identity, and whether
it reaches the engine. The batch-line parser (:mod:`.batch_requests`), the engines' parameters
(``engines/answers/plan.py``), the answer identity (:mod:`.identity`) and docs/batch-files.md's
table all read :data:`FIELDS`; a test keeps ``SamplingSpec`` and the docs equal to it.

"Unset" is None everywhere: a layer that leaves a field None lets the next one decide, in vLLM's
order (:func:`merged`): the request's value, then the job's, then the model's
``generation_config.json``, then the API's default. Example::

    FIELDS_BY_NAME["temperature"].openai          # ("temperature",)
    merged({"top_k": None}, {"top_k": 20})        # {"top_k": 20}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Provider = Literal["openai_batch", "anthropic_batch"]


@dataclass(frozen=True)
class RequestField:
    """One sampling field. ``openai`` / ``anthropic``: the names a request line gives it there
    (empty: that API has none; the first name is the one docs show); ``kind``: its JSON type, for
    the docs; ``identity``: part of the answer's identity (a field that changes the engine's
    answer); ``engine``: sent to the engine, under this name, in ``SamplingParams`` and the
    OpenAI-compatible server's body alike; ``ranges``: a provider's own bounds, where narrower than
    ``SamplingSpec``'s (Anthropic's temperature is 0 to 1)."""

    name: str
    openai: tuple[str, ...]
    anthropic: tuple[str, ...]
    kind: str
    identity: bool = True
    engine: bool = True
    ranges: tuple[tuple[Provider, float, float], ...] = ()

    def names(self, provider: str) -> tuple[str, ...]:
        """The line's names for this field under ``provider`` (empty: not a field of that API)."""
        return self.openai if provider == "openai_batch" else self.anthropic

    def bounds(self, provider: str) -> tuple[float, float] | None:
        """The provider's own range of this field, when it has a narrower one than ours."""
        return next(((lo, hi) for p, lo, hi in self.ranges if p == provider), None)


#: The declaration. ``max_tokens`` is sent by the engines themselves (a one-step label and a
#: thinking budget change it), ``logprobs`` too (the confidence scorer may ask for more).
FIELDS: tuple[RequestField, ...] = (
    RequestField("max_tokens", ("max_tokens", "max_completion_tokens"), ("max_tokens",), "integer", engine=False),
    RequestField("temperature", ("temperature",), ("temperature",), "number",
                 ranges=(("anthropic_batch", 0.0, 1.0),)),
    RequestField("top_p", ("top_p",), ("top_p",), "number"),
    RequestField("top_k", (), ("top_k",), "integer"),
    RequestField("seed", ("seed",), (), "integer"),
    RequestField("stop", ("stop",), ("stop_sequences",), "string or list of strings"),
    RequestField("n", ("n",), (), "integer"),
    RequestField("presence_penalty", ("presence_penalty",), (), "number"),
    RequestField("frequency_penalty", ("frequency_penalty",), (), "number"),
    RequestField("logit_bias", ("logit_bias",), (), "object: token id -> number"),
    RequestField("logprobs", ("logprobs", "top_logprobs"), (), "boolean + integer", engine=False),
    # The job's alone (no request line sets them): still what the engine is given.
    RequestField("ignore_eos", (), (), "boolean"),
    RequestField("reasoning", (), (), "'off', 'auto' or integer", engine=False),
)
FIELDS_BY_NAME = {f.name: f for f in FIELDS}

#: What a line of each API gets for a field it leaves out, when the job does not set that field
#: itself: the hosted APIs' defaults (both sample at temperature 1; no seed: each answer a draw).
LINE_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "seed": None}


def line_names(provider: str) -> dict[str, str]:
    """A provider's request names of the sampling fields -> ours (``max_completion_tokens`` ->
    ``max_tokens``): what the batch-line parser reads."""
    return {alias: f.name for f in FIELDS for alias in f.names(provider)}


def plain(sampling: Any) -> dict[str, Any]:
    """Every field of ``sampling`` (a ``SamplingSpec``) as plain data, as the engines send it and
    so as the answer identity names it (one rule for both): ``stop`` a list and ``logit_bias``
    keyed by token id as text (as the API's JSON has it), None when empty; no seed under greedy
    decoding (temperature 0), which reads none."""
    data = {f.name: getattr(sampling, f.name) for f in FIELDS}
    data["stop"] = list(data["stop"]) if data["stop"] else None
    # -0.0 biases as 0.0 does: one spelling of each number.
    data["logit_bias"] = {str(k): v + 0.0 for k, v in data["logit_bias"].items()} if data["logit_bias"] else None
    if not data["temperature"]:
        data["seed"] = None
    return data


def merged(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The one merge: for every key any layer names, the first layer's value that is not None
    (layers in precedence order: request, job, model, API default). A key every layer leaves
    None stays None: the engine's own default applies."""
    out: dict[str, Any] = {}
    for layer in reversed(layers):
        for key, value in layer.items():
            if value is not None or key not in out:
                out[key] = value
    return out


def field_table() -> str:
    """docs/batch-files.md's table of the sampling fields, rendered from :data:`FIELDS` (a test
    keeps the docs equal to it)."""
    def names(values: tuple[str, ...]) -> str:
        return ", ".join(f"`{v}`" for v in values) or "none"

    rows = ["| here (`sampling.`) | OpenAI `body.` | Anthropic `params.` | type | names the answer | a line that "
            "leaves it out gets |", "|---|---|---|---|---|---|"]
    for f in FIELDS:
        default = LINE_DEFAULTS.get(f.name, "the job's")
        left_out = "the job's" if default == "the job's" else \
            f"the job's if the job sets it, else `{'null' if default is None else default}`"
        ranges = "".join(f" ({'Anthropic' if p == 'anthropic_batch' else 'OpenAI'}: {lo:g} to {hi:g})"
                         for p, lo, hi in f.ranges)
        rows.append(f"| `{f.name}` | {names(f.openai)} | {names(f.anthropic)} | {f.kind}{ranges} | "
                    f"{'yes' if f.identity else 'no'} | {left_out} |")
    return "\n".join(rows)
