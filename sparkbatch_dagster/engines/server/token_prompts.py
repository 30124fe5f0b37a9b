"""Pre-tokenized prompts (``VLLMResource.server_token_ids``): the model's chat template and
tokenizer applied in this process, the token ids sent to ``/v1/completions``, so the server's
HTTP frontend (one Python process) neither renders nor tokenizes.

The ids are the ones ``/v1/chat/completions`` would make: vLLM renders the tokenizer's chat
template with ``add_generation_prompt`` and tokenizes the text without adding special tokens
(the template has them), and so does :func:`token_body`. A server started with another
``--chat-template`` renders differently: leave the option off for it.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from ...spec.prompts import chat_text


def load_tokenizer(path: str) -> Any:
    """The tokenizer of the served model, from the folder (or hub name) the server loaded it from."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # no such folder here, no hub access, no transformers
        raise ConfigError(f"server_token_ids needs the model's tokenizer in this process, from {path!r} (where the "
                          f"server loaded the model: its /v1/models root): {type(exc).__name__}: {exc}: make that "
                          "folder readable here, or leave server_token_ids off") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer at {path!r} has no chat template: use a chat (instruct) model, or leave "
                          "server_token_ids off")
    return tokenizer


def token_body(tokenizer: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A chat-completions body as a completions body: ``messages`` become ``prompt`` token ids."""
    return token_bodies(tokenizer, [body])[0]


def token_bodies(tokenizer: Any, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`token_body` of each, in one tokenizer call (its Rust part spreads a batch over
    cores, and releases the GIL while it runs)."""
    out, texts = [], []
    for body in bodies:
        one = dict(body)
        kwargs = one.pop("chat_template_kwargs", None)  # a reasoning job's enable_thinking: applied here
        tools = one.pop("tools", None)  # a batch line's: rendered here by the template, as offline
        texts.append(chat_text(tokenizer, one.pop("messages"), kwargs, tools))  # the text offline mode and preview use
        out.append(one)
    if not out:
        return out
    special = texts[0][1]  # one tokenizer: the same answer for every body
    ids = tokenizer([text for text, _ in texts], add_special_tokens=special)["input_ids"]
    for one, prompt in zip(out, ids, strict=True):
        one["prompt"] = list(prompt)
    return out
