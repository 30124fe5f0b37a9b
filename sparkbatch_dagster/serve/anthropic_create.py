"""A Message Batches create read without holding its requests as objects (:func:`new_message_batch`).

The body is one JSON object, ``{"requests": [...]}``, up to the server's body cap. Parsed whole
by pydantic, a 159 MiB body took 595 MiB more before its checks refused it (issue 59). Here the
body's bytes are the only copy: the requests are decoded as raw slices of it (``msgspec.Raw``),
their number checked first (Anthropic's :data:`.anthropic_models.MAX_REQUESTS`), then each one
validated and written to the batch's requests file in turn, so what the server holds beyond the
body is one request at a time. A request Anthropic would refuse is a 400 naming it and its field
(``requests.3.params.max_tokens: ...``), and nothing is created.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

import msgspec
from pydantic import ValidationError

from .anthropic_models import MAX_REQUESTS, BatchRequestItem
from .guard import ApiError
from .openai_models import RequestCounts
from .record import MESSAGE_BATCH, BatchRecord
from .store import Store, now

#: Seconds from creation to expiry: Anthropic's 24 hours.
WINDOW_S = 24 * 3600


class _Body(msgspec.Struct):
    """The create's body, each request left as its bytes."""

    requests: list[msgspec.Raw]


def read_requests(body: bytes | bytearray) -> list[msgspec.Raw]:
    """The requests of a create's body, as raw JSON slices of it; a 400 when it is no such body,
    or holds none or more than Anthropic takes."""
    try:
        requests = msgspec.json.decode(body, type=_Body).requests
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"requests: {exc} (send {{\"requests\": [{{\"custom_id\", \"params\"}}, ...]}})",
                       "invalid_request") from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"the body is not JSON: {exc}", "invalid_json") from None
    if not requests:
        raise ApiError(400, "requests: List should have at least 1 item after validation, not 0", "too_short")
    if len(requests) > MAX_REQUESTS:
        raise ApiError(400, f"requests: {len(requests)} requests, the most one Message Batch takes is {MAX_REQUESTS}"
                       ": split them into several batches", "too_long")
    return requests


def new_message_batch(store: Store, body: bytes | bytearray) -> BatchRecord:
    """Check a create's requests one by one, store them as an ``anthropic_batch`` file, and its
    batch, ``in_progress`` (a Message Batch begins processing when it is created), to be queued
    by the caller."""
    requests = read_requests(body)
    created = now()
    # The time first, so that batches created in one second still list newest first by id.
    bid = f"msgbatch_{time.time_ns():016x}{secrets.token_hex(6)}"
    path = store.file_path(f"{bid}-requests")
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            _write(requests, out)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return store.save(BatchRecord(
        id=bid, format=MESSAGE_BATCH, status="in_progress", input_file_id=f"{bid}-requests", created_at=created,
        in_progress_at=created, expires_at=created + WINDOW_S,
        request_counts=RequestCounts(total=len(requests), completed=0, failed=0)))


def _write(requests: list[msgspec.Raw], out: Any) -> None:
    """Each request checked (Anthropic's ``custom_id`` pattern and uniqueness, ``params`` with
    ``model``, ``max_tokens`` and ``messages``), then written as one line."""
    seen: dict[str, int] = {}
    for n, raw in enumerate(requests):
        try:
            item = BatchRequestItem.model_validate_json(bytes(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (f"requests.{n}", *first["loc"]))
            raise ApiError(400, f"{where}: {first['msg']}", str(first["type"])) from None
        if item.custom_id in seen:
            raise ApiError(400, f"requests.{n}.custom_id: {item.custom_id!r} is also requests.{seen[item.custom_id]}'s"
                           ": each request of a batch needs its own custom_id", "invalid_request")
        seen[item.custom_id] = n
        out.write(json.dumps({"custom_id": item.custom_id, "params": item.params.model_dump()},
                             ensure_ascii=False) + "\n")
