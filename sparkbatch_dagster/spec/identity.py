"""The identity of an answer: what the engine receives for it, hashed from canonical JSON.

An answer is named by the messages exactly as the engine gets them (roles, contents, a turn's
``name``; an empty system message is not no system message), the tools given to the chat
template, the effective sampling (:func:`effective`: every field of :data:`.request_fields.FIELDS`
that is part of the identity, after the request/job merge) and the output spec. The model's
``generation_config.json`` and chat template are not in the key: they are part of the model
identity, which names the result store's folder (``JobSpec.answer_context``). The chat template's
rendering is not applied here (it is the engine's, not known before the engine starts): two
message lists it would render alike keep apart, a missed reuse, never a wrong answer.

A *draw* (:func:`is_draw`: temperature above 0 and no seed) has no identity: it is generated
every time, never shared in a batch, never stored. Example::

    key = answer_key(prompt.messages(), None, spec.sampling, spec.output)   # 32 hex, or None
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from .answer import OutputSpec, SamplingSpec
from .request_fields import FIELDS, plain

#: The fields that name an answer (:data:`.request_fields.FIELDS`' ``identity``).
_IDENTITY = tuple(f.name for f in FIELDS if f.identity)


def is_draw(sampling: SamplingSpec) -> bool:
    """Whether an answer under ``sampling`` is a sample that must be drawn each time: temperature
    above 0 and no seed (each call may answer differently)."""
    return sampling.temperature > 0 and sampling.seed is None


def effective(sampling: SamplingSpec) -> dict[str, Any]:
    """The sampling an answer is generated under, as plain data (:func:`.request_fields.plain`,
    as the engine gets it): every identity field, unset as None. Greedy decoding (temperature 0)
    does not read the seed, so its seed is None: a job's seed 0 and a line without one get the
    same greedy answer."""
    # -0.0 samples as 0.0 does: one spelling of each number.
    return {k: v + 0.0 if isinstance(v, float) else v for k, v in plain(sampling).items() if k in _IDENTITY}


def engine_input(messages: list[dict[str, str]], tools: Any, sampling: SamplingSpec,
                 output: OutputSpec) -> dict[str, Any]:
    """What the engine receives for one answer, as plain data: what :func:`answer_key` hashes
    (its ``sampling`` and ``output`` are shared between calls: read them, never change them)."""
    return {"messages": [dict(m) for m in messages],
            "tools": msgspec.to_builtins(tools) if tools is not None else None, **_settings(sampling, output)}


#: The last settings part made, with what it was made from. Every row of a job names its answer
#: under the same two specs, and making their plain data (the merge, pydantic's dump) was most of
#: a key's cost, once a row; specs are frozen, so the same objects give the same data.
_made: list[tuple[SamplingSpec, OutputSpec, tuple[str, ...], dict[str, Any]]] = []


def _settings(sampling: SamplingSpec, output: OutputSpec) -> dict[str, Any]:
    """The sampling and output part of :func:`engine_input`, made once per pair of specs (keyed
    on all it reads: the two specs and the identity's fields)."""
    last = _made[-1] if _made else None
    if last is None or last[0] is not sampling or last[1] is not output or last[2] is not _IDENTITY:
        last = (sampling, output, _IDENTITY, {"sampling": effective(sampling), "output": output.identity()})
        _made[:] = [last]
    return last[3]


def canonical(value: Any) -> bytes:
    """One byte string per value: sorted keys, no whitespace, text as UTF-8 (a lone surrogate
    kept as its code point, never merged with U+FFFD), no NaN."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8", "surrogatepass")


def answer_key(messages: list[dict[str, str]], tools: Any, sampling: SamplingSpec,
               output: OutputSpec) -> str | None:
    """32 hex characters naming the answer to this engine input (the rows' ``prompt_key``, the
    result store's key); None for a draw, which has no reusable answer."""
    if is_draw(sampling):
        return None
    return hashlib.sha256(canonical(engine_input(messages, tools, sampling, output))).hexdigest()[:32]
