"""A reasoning job against a server (:mod:`.vllm_server`): what its requests add, and its answers.

A `vllm serve` started here takes ``engine_kwargs={"reasoning_parser": ...}`` as its
``--reasoning-parser``; a server someone else runs needs the same flag. With it, vLLM bounds the
thinking (``thinking_token_budget``) and its grammar starts after the thinking; the chat endpoint
returns the thinking apart (``message.reasoning``). Without it every request is refused (HTTP 400
naming ``--reasoning-parser``) and the run stops before writing a row. Example::

    plan = server_reasoning(None, SamplingSpec(reasoning=256, max_tokens=300))
    body.update(reasoning_fields(plan))   # {"thinking_token_budget": 256, "chat_template_kwargs": {...}}
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..spec import SamplingSpec
from . import reasoning
from .base import EngineResult


def server_reasoning(tokenizer: Any, sampling: SamplingSpec) -> reasoning.Plan | None:
    """A reasoning job's plan against a server. With the model's tokenizer here (server_token_ids)
    as offline; without it the template is the server's, so ``auto`` cannot be decided here."""
    if sampling.reasoning == "off":
        return None
    if tokenizer is not None:
        return reasoning.plan(tokenizer, sampling)
    if sampling.reasoning == "auto":
        raise ConfigError("sampling.reasoning='auto' reads the model's chat template, which a chat server keeps to "
                          "itself: set a thinking budget (e.g. reasoning: 512), or server_token_ids=True so that the "
                          "template is read here")
    budget = int(sampling.reasoning)
    problem = reasoning.room_problem(sampling, budget)
    if problem:
        raise ConfigError(problem)
    return reasoning.Plan(budget, reasoning.Markers(*reasoning.KNOWN_MARKERS[0]), {"enable_thinking": True})


def reasoning_fields(plan: reasoning.Plan) -> dict[str, Any]:
    """What a request adds for a reasoning job: vLLM's ``thinking_token_budget`` (the server must run
    with ``--reasoning-parser``, which also makes its grammar start after the thinking; a server
    without one answers HTTP 400 to every request, and the run stops naming it) and the
    template's thinking switch."""
    fields: dict[str, Any] = {"thinking_token_budget": plan.budget}
    if plan.template_kwargs:
        fields["chat_template_kwargs"] = dict(plan.template_kwargs)
    return fields


def reasoned_result(row_id: str, text: str, choice: dict[str, Any], usage: dict[str, Any], plan: reasoning.Plan,
                    tokenizer: Any) -> EngineResult:
    """A reasoning job's answer from a server: the thinking from the chat message's ``reasoning``
    (``reasoning_content`` on older servers) when its parser split it, else split here at the end
    marker. Its tokens: the server's ``reasoning_tokens`` when it counts them, else counted here
    with the tokenizer (none without one). No confidence: a server's log-probabilities also
    cover the thinking."""
    message = choice.get("message") or {}
    thought = message.get("reasoning", message.get("reasoning_content"))
    answer: str | None = text.lstrip()
    if thought is None and (plan.markers.end in text or plan.markers.start in text):
        thought, answer = reasoning.split_text(text, plan.markers)  # a server without a parser
    thought = thought or ""  # none: the model answered without thinking
    output_tokens = int(usage.get("completion_tokens", 0))
    counted = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if counted is None and tokenizer is not None:
        counted = len(tokenizer(thought, add_special_tokens=False)["input_ids"]) + 1
    spent = min(int(counted or 0), output_tokens)
    common = dict(prompt_tokens=int(usage.get("prompt_tokens", 0)), output_tokens=output_tokens,
                  cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                  finish_reason=choice.get("finish_reason"), reasoning=thought, reasoning_tokens=spent)
    if answer is None:
        return EngineResult(row_id, None, error=f"reasoning_unfinished: the model stopped inside its thinking "
                            f"(thinking_token_budget={plan.budget}) and gave no answer", **common)  # type: ignore[arg-type]
    return EngineResult(row_id, answer, **common)  # type: ignore[arg-type]
