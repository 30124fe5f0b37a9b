"""A reasoning job against a server (:mod:`.vllm_server`): its answers.

A `vllm serve` started here takes ``engine_kwargs={"reasoning_parser": ...}`` as its
``--reasoning-parser``; a server someone else runs needs the same flag. With it, vLLM bounds the
thinking (``thinking_token_budget``) and its grammar starts after the thinking; the chat endpoint
returns the thinking apart (``message.reasoning``). Without it every request is refused (HTTP 400
naming ``--reasoning-parser``) and the run stops before writing a row. What a request adds is
the plan's (``answers/plan.py``: :func:`..answers.reasoning.request_fields`); the answers are read here.
"""

from __future__ import annotations

from typing import Any

from ..answers import reasoning
from ..base import EngineResult


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
