"""What OpenAI's Files and Batches routes share: a cursor page of a list (:func:`page`) and the
OpenAPI links from an answer's fields to the operations that take them (:func:`links`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .record import ENDPOINT


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_Identified)


def page(items: Sequence[T], after: str | None, limit: int) -> tuple[list[T], bool]:
    """A cursor page, as OpenAI's lists: ``limit`` items after the id ``after`` (unknown: none),
    and whether more follow (the list model's ``of`` makes the page's object)."""
    if after is not None:
        ids = [item.id for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    return list(items[:limit]), len(items) > limit


def links(targets: dict[str, tuple[str, dict[str, str]]]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI links from a 200 answer's fields to the operations that take them: ``{name:
    (operation, {parameter: field})}`` (a fuzzer follows them from an upload to its batch)."""
    def link(operation: str, fields: dict[str, str]) -> dict[str, Any]:
        values = {name: f"$response.body#/{field}" for name, field in fields.items()}
        if operation == "batches_create":  # a body, not parameters
            return {"operationId": operation, "requestBody": {**values, "endpoint": ENDPOINT}}
        return {"operationId": operation, "parameters": values}

    return {200: {"links": {name: link(*target) for name, target in targets.items()}}}
