"""What OpenAI's Files and Batches routes share: a cursor page of a list (:func:`page`) and the
OpenAPI links from an answer's fields to the operations that take them (:func:`links`)."""

from __future__ import annotations

from typing import Any

from .store import ENDPOINT


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """A cursor page, as OpenAI's lists: ``limit`` items after the id ``after`` (unknown: none)."""
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    chosen = items[:limit]
    return {"object": "list", "data": chosen, "first_id": chosen[0]["id"] if chosen else None,
            "last_id": chosen[-1]["id"] if chosen else None, "has_more": len(items) > limit}


def links(targets: dict[str, tuple[str, dict[str, str]]]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI links from a 200 answer's fields to the operations that take them: ``{name:
    (operation, {parameter: field})}`` (a fuzzer follows them from an upload to its batch)."""
    def link(operation: str, fields: dict[str, str]) -> dict[str, Any]:
        values = {name: f"$response.body#/{field}" for name, field in fields.items()}
        if operation == "batches_create":  # a body, not parameters
            return {"operationId": operation, "requestBody": {**values, "endpoint": ENDPOINT}}
        return {"operationId": operation, "parameters": values}

    return {200: {"links": {name: link(*target) for name, target in targets.items()}}}
