"""What an answer carries beyond its text, for a request that asks for it (a batch file's line
with ``stop``, ``n`` above 1 or ``logprobs``): the stop string that ended it, each token's
log-probability with the likeliest alternatives, and the further choices.

An engine gives them as :class:`Extras`' JSON (:func:`of_vllm` offline, :func:`of_openai` from
a server's answer), the row keeps that text in its ``extra`` column (and the result store with
the answer, so a reused answer has them too), and the batch exporter reads it back
(:meth:`Extras.decode`) into the providers' fields. Example::

    text = of_vllm(request_output, tokenizer, sampling)      # None: the request asked for nothing more
    Extras.decode(text).choices[0].text                       # the second answer
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ...spec import SamplingSpec


class TopLogprob(msgspec.Struct, frozen=True):
    """One of the likeliest tokens at a step: its text and log-probability."""

    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True):
    """One answer token: its text, its log-probability, the likeliest tokens at its step."""

    token: str
    logprob: float
    top: list[TopLogprob] = []


class Choice(msgspec.Struct, frozen=True, omit_defaults=True):
    """A further answer to the same prompt (``n`` above 1)."""

    text: str
    finish_reason: str | None = None
    stop: str | None = None
    logprobs: list[TokenLogprob] | None = None


class ToolCall(msgspec.Struct, frozen=True):
    """One tool call of an answer (:mod:`.tools`): its id (hex; each provider's prefix is added
    on export), the tool's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str


class Extras(msgspec.Struct, frozen=True, omit_defaults=True):
    """The first answer's ``stop`` string (the one that ended it; None: it ended otherwise) and
    ``logprobs``, the ``choices`` after it, and the first answer's ``tool_calls`` (a batch line
    with tools; ``content``: the text besides them, None when there is none)."""

    stop: str | None = None
    logprobs: list[TokenLogprob] | None = None
    choices: list[Choice] = []
    tool_calls: list[ToolCall] = []
    content: str | None = None

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str | None) -> Extras:
        """A row's ``extra`` column read back; None (a row that asked for nothing more): empty."""
        return msgspec.json.decode(text, type=cls) if text else cls()


def of_vllm(out: Any, tokenizer: Any, sampling: SamplingSpec) -> str | None:
    """The extras of a finished vLLM ``RequestOutput`` (its token ids, not detokenized), as asked
    by ``sampling``; None when it asks for none."""
    if not sampling.extras_asked():
        return None
    done = list(out.outputs)
    # One tokenizer call for every token these answers need spelled: texts and log-probability pieces.
    wanted = sorted({t for c in done[1:] for t in c.token_ids} | _logprob_ids(done, sampling))
    spelled = dict(zip(wanted, tokenizer.batch_decode([[t] for t in wanted]), strict=True)) if wanted else {}
    # Answers with stop strings come detokenized and cut before the stop string (their tokens are not).
    texts = [c.text for c in done[1:]] if sampling.stop else \
        tokenizer.batch_decode([list(c.token_ids) for c in done[1:]], skip_special_tokens=True) if done[1:] else []

    def logprobs(c: Any) -> list[TokenLogprob] | None:
        if sampling.logprobs is None or c.logprobs is None:
            return None
        return [_token(spelled, t, step, sampling.logprobs) for t, step in zip(c.token_ids, c.logprobs, strict=False)]

    rest = [Choice(text, c.finish_reason, _stop(c.stop_reason), logprobs(c)) for c, text in zip(done[1:], texts,
                                                                                                 strict=True)]
    return Extras(_stop(done[0].stop_reason), logprobs(done[0]), rest).encode()


def _logprob_ids(done: Sequence[Any], sampling: SamplingSpec) -> set[int]:
    if sampling.logprobs is None:
        return set()
    return {t for c in done for step in (c.logprobs or []) for t in step}


def _token(spelled: Mapping[int, str], token: int, step: Mapping[int, Any], top: int) -> TokenLogprob:
    ranked = sorted(step.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 1 << 30)
    chosen = step.get(token)
    return TokenLogprob(spelled.get(token, ""), float(chosen.logprob) if chosen is not None else float("-inf"),
                        [TopLogprob(spelled.get(t, ""), float(lp.logprob)) for t, lp in ranked[:top]])


def _stop(reason: Any) -> str | None:
    """vLLM's ``stop_reason``: the stop string that ended the answer (a token id or None otherwise)."""
    return reason if isinstance(reason, str) else None


def of_openai(choices: Sequence[Mapping[str, Any]], sampling: SamplingSpec) -> str | None:
    """The extras of a server's answer (its ``choices``, chat or completion), as asked by ``sampling``."""
    if not sampling.extras_asked():
        return None
    ordered = sorted(choices, key=lambda c: c.get("index", 0))

    def logprobs(c: Mapping[str, Any]) -> list[TokenLogprob] | None:
        return _openai_logprobs(c.get("logprobs")) if sampling.logprobs is not None else None

    rest = [Choice(_text(c), c.get("finish_reason"), _stop(c.get("stop_reason")), logprobs(c)) for c in ordered[1:]]
    return Extras(_stop(ordered[0].get("stop_reason")), logprobs(ordered[0]), rest).encode()


def _text(choice: Mapping[str, Any]) -> str:
    return (choice["text"] if "text" in choice else (choice.get("message") or {}).get("content")) or ""


def _openai_logprobs(data: Mapping[str, Any] | None) -> list[TokenLogprob] | None:
    """A chat answer's ``logprobs.content``, or a completion's ``tokens`` / ``token_logprobs`` /
    ``top_logprobs``."""
    if not data:
        return None
    if data.get("content") is not None:
        return [TokenLogprob(t["token"], float(t["logprob"]),
                             [TopLogprob(a["token"], float(a["logprob"])) for a in t.get("top_logprobs") or []])
                for t in data["content"]]
    tops = data.get("top_logprobs") or [None] * len(data.get("tokens") or [])
    return [TokenLogprob(tok, float(lp if lp is not None else float("-inf")),
                         [TopLogprob(k, float(v)) for k, v in sorted((top or {}).items(), key=lambda kv: -kv[1])])
            for tok, lp, top in zip(data.get("tokens") or [], data.get("token_logprobs") or [], tops, strict=False)]
