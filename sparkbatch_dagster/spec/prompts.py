"""Prompt rendering in a Jinja sandbox, and the per-row text checks that make error rows.

Input values are passed to the template as data: a description that contains ``{{ 7*7 }}``
stays that literal string, and the template itself cannot reach Python internals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConfigError
from .answer import OutputSpec, SamplingSpec
from .identity import answer_key

# C0 control characters other than tab, newline and carriage return; U+FFFD marks bytes that
# were not valid UTF-8 when the input was decoded.
_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")


@lru_cache(maxsize=1)
def _env() -> Any:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


@lru_cache(maxsize=64)
def _compiled(template: str) -> Any:
    return _env().from_string(template)


@lru_cache(maxsize=64)
def _pieces(template: str) -> tuple[tuple[bool, str], ...] | None:
    """A template that only puts columns into text (``Package: {{ package }}``) as its pieces,
    ``(True, column)`` or ``(False, text)``, which :func:`render` joins as Jinja would render them
    (a fixed system prompt is one piece): microseconds a row instead of tens. None for any other
    template (filters, tests, loops...), which Jinja renders."""
    from jinja2 import nodes

    body = _env().parse(template).body
    if not body:
        return ()
    if len(body) != 1 or not isinstance(body[0], nodes.Output):
        return None
    pieces = []
    for node in body[0].nodes:
        if isinstance(node, nodes.TemplateData):
            pieces.append((False, node.data))
        elif isinstance(node, nodes.Name) and node.ctx == "load":
            pieces.append((True, node.name))
        else:
            return None
    return tuple(pieces)


def _render(template: str, values: dict[str, Any]) -> str:
    pieces = _pieces(template)
    if pieces is None or not all(name in values for var, name in pieces if var):
        return str(_compiled(template).render(values))  # a missing column: Jinja's own error
    return "".join(str(values[text]) if var else text for var, text in pieces)


def check_template(template: str, columns: list[str], field: str) -> None:
    """Fail early when a template does not parse or uses a variable that is not a column."""
    from jinja2 import TemplateSyntaxError, meta

    try:
        ast = _env().parse(template)
    except TemplateSyntaxError as exc:
        raise ValueError(f"{field} does not parse (line {exc.lineno}): {exc.message}") from None
    unknown = sorted(meta.find_undeclared_variables(ast) - set(columns))
    if unknown:
        raise ValueError(
            f"{field} uses {unknown}, which are not in text_columns {columns}: "
            "add them to text_columns or fix the template"
        )


@dataclass(frozen=True)
class RenderedPrompt:
    """Chat messages for one row: a system message only when the system prompt renders to text
    (a job without one sends none), then the user's."""

    system: str
    user: str

    @property
    def order(self) -> str:
        """Text that sorts prompts sharing a prefix next to each other (ordering only, never a name)."""
        return self.system + "\x1e" + self.user

    def messages(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.user}]

    def answer_key(self, sampling: SamplingSpec, output: OutputSpec) -> str | None:
        """Its answer's name under the job's ``sampling`` and ``output`` (:func:`.identity.answer_key`)."""
        return answer_key(self.messages(), None, sampling, output)


def check_text(value: Any, column: str, max_chars: int) -> str | None:
    """Return an error reason for one input value, or None when it is usable text."""
    if value is None:
        return f"null_text: column {column!r} is null"
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"invalid_text: column {column!r} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if not isinstance(value, str):
        return f"bad_type: column {column!r} holds {type(value).__name__}, expected text"
    if not value.strip():
        return f"empty_text: column {column!r} is empty"
    if len(value) > max_chars:
        return f"too_long: column {column!r} has {len(value)} characters, max_input_chars={max_chars}"
    bad = _BAD_CHARS.search(value)
    if bad:
        return f"invalid_text: column {column!r} has control or undecodable character {bad.group()!r}"
    return None


def render(system: str, user: str, row: dict[str, Any]) -> RenderedPrompt:
    """Render both templates for one row of already-checked values."""
    values = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in row.items()}
    try:
        return RenderedPrompt(_render(system, values) if system else "", _render(user, values))
    except Exception as exc:  # a sandbox violation or a template error is the row's problem
        raise ConfigError(f"template failed to render: {exc}") from exc


def chat_text(tokenizer: Any, messages: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None,
              tools: list[dict[str, Any]] | None = None) -> tuple[str, bool]:
    """The exact text a model is given for ``messages``, and whether the tokenizer should still
    add its special tokens (the chat template already holds them). A model without a chat
    template (a base model) gets the plain contents, as the offline engine gives them.
    ``template_kwargs``: variables for the template (``enable_thinking`` of a reasoning job);
    ``tools``: a batch line's tools, rendered by the template as vLLM's server renders them."""
    if getattr(tokenizer, "chat_template", None):
        extra = {"tools": tools} if tools else {}
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(template_kwargs or {}), **extra), False
    return "\n\n".join(m["content"] for m in messages), True
