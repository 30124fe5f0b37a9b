"""Anthropic's Message Batches API on ``sparkbatch serve-batch`` (:func:`anthropic_router`, included
by :func:`.app.make_app`), so that an unchanged ``anthropic`` client runs its batches
on the box::

    client = anthropic.Anthropic(base_url="http://127.0.0.1:8400", api_key="unused-on-loopback")
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": {...}}])
    ...  # client.messages.batches.retrieve(batch.id).processing_status == "ended"
    for line in client.messages.batches.results(batch.id): ...

A Message Batch is a batch of the server's one queue, stored as the OpenAI batches are
(:class:`.record.BatchRecord`, ``format`` ``anthropic_batch``, rendered as Anthropic's
MessageBatch object by :func:`message_batch`): its requests become an ``anthropic_batch``
JSONL file, run as a job by the same worker on the same answer store, one results file
(:mod:`.ending`). Its requests are checked when it is created, as Anthropic checks them
(the ``custom_id`` pattern and uniqueness, ``params`` with ``model``, ``max_tokens`` and
``messages``), one at a time from the body's bytes (:mod:`.anthropic_create`): a 400 names the
request and field. Errors here are Anthropic's shape.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from .anthropic_create import new_message_batch
from .anthropic_models import (
    AnthropicErrorResponse,
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchList,
    MessageBatchRequestCounts,
)
from .guard import ApiError
from .record import MESSAGE_BATCH, BatchRecord
from .results import ANTHROPIC_TYPES
from .store import Store
from .worker import Worker

__all__ = ["anthropic_router", "message_batch"]

#: The results file's media type.
JSONL = "application/x-jsonl"


def anthropic_router(store: Store, worker: Worker) -> APIRouter:
    """The Message Batches routes on ``store`` and ``worker``."""
    router = APIRouter(prefix="/v1/messages/batches")
    errors: dict[int | str, dict[str, Any]] = {
        404: {"model": AnthropicErrorResponse, "description": "no such Message Batch"}}

    @router.post("", response_model=MessageBatch, operation_id="message_batches_create",
                 openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "$ref": "#/components/schemas/MessageBatchCreate"}}}}})
    async def create(request: Request) -> MessageBatch:
        # The body as it comes (the guard caps it), then checked and written request by request
        # in a worker thread: never parsed whole into objects (anthropic_create).
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
        batch = await run_in_threadpool(new_message_batch, store, body)
        del body
        worker.submit(batch)
        return message_batch(batch, str(request.base_url))

    @router.get("", response_model=MessageBatchList, operation_id="message_batches_list")
    def list_batches(request: Request,
                     before_id: Annotated[str | None, Query(description="the page just before this id")] = None,
                     after_id: Annotated[str | None, Query(description="the page just after this id")] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> MessageBatchList:
        batches = [b for b in store.all_batches() if b.format == MESSAGE_BATCH]  # newest first
        page, more = _page(batches, before_id, after_id, limit)
        data = [message_batch(b, str(request.base_url)) for b in page]
        return MessageBatchList(data=data, has_more=more, first_id=data[0].id if data else None,
                                last_id=data[-1].id if data else None)

    @router.get("/{message_batch_id}", response_model=MessageBatch, responses=errors,
                operation_id="message_batches_retrieve")
    def retrieve(message_batch_id: str, request: Request) -> MessageBatch:
        batch = _record(store, message_batch_id)
        # The stored counts follow the finished rows (as an OpenAI batch's do), though Anthropic's
        # object shows them only once the batch has ended.
        return message_batch(worker.progress(message_batch_id) or batch, str(request.base_url))

    @router.post("/{message_batch_id}/cancel", response_model=MessageBatch, responses=errors,
                 operation_id="message_batches_cancel")
    def cancel(message_batch_id: str, request: Request) -> MessageBatch:
        _record(store, message_batch_id)
        return message_batch(worker.cancel(message_batch_id), str(request.base_url))

    @router.delete("/{message_batch_id}", response_model=DeletedMessageBatch, operation_id="message_batches_delete",
                   responses={**errors, 400: {"model": AnthropicErrorResponse,
                                              "description": "the batch has not ended: cancel it first"}})
    def delete(message_batch_id: str) -> DeletedMessageBatch:
        with store.lock:
            batch = _record(store, message_batch_id)
            if batch.is_open:
                raise ApiError(400, f"Message Batch {message_batch_id} is still processing: only an ended batch "
                               "can be deleted; cancel it (messages.batches.cancel), wait until its processing_status "
                               "is 'ended', then delete it", "invalid_request")
            store.delete_batch(message_batch_id)
        return DeletedMessageBatch(id=message_batch_id)

    @router.get("/{message_batch_id}/results", response_class=FileResponse, operation_id="message_batches_results",
                responses={**errors, 200: {"content": {JSONL: {"schema": {"type": "string"}}},
                                           "description": "one result line per request, every custom_id once"},
                           400: {"model": AnthropicErrorResponse, "description": "the batch has not ended yet"}})
    def results(message_batch_id: str) -> Response:
        if _record(store, message_batch_id).is_open:
            raise ApiError(400, f"Message Batch {message_batch_id} has no results yet: they are served once its "
                           "processing_status is 'ended' (its results_url is set then)", "invalid_request")
        path = store.folder(message_batch_id) / "output.jsonl"
        if not path.is_file():
            return Response(b"", media_type=JSONL)
        return FileResponse(path, media_type=JSONL)  # streamed in chunks, never read whole

    return router


def message_batch(batch: BatchRecord, base_url: str) -> MessageBatch:
    """The MessageBatch object of a stored batch; ``base_url``: the server's, as the client reached it."""
    status, over, counted = batch.status, not batch.is_open, batch.request_counts
    counts = MessageBatchRequestCounts(processing=counted.total, succeeded=0, errored=0, canceled=0, expired=0)
    if over:  # Anthropic's counts move only once the whole batch has ended
        unrun = batch.unrun_requests
        unrun_as = ANTHROPIC_TYPES.get(status)  # how the ending counts a request not run, as its result line
        counts = MessageBatchRequestCounts(processing=0, succeeded=counted.completed,
                                           errored=counted.failed - (unrun if unrun_as else 0),
                                           canceled=unrun if unrun_as == "canceled" else 0,
                                           expired=unrun if unrun_as == "expired" else 0)
    return MessageBatch(
        id=batch.id, processing_status="canceling" if status == "cancelling" else "ended" if over else "in_progress",
        request_counts=counts, ended_at=_time(batch.at(status)) if over else None,
        created_at=_rfc3339(batch.created_at), expires_at=_rfc3339(batch.expires_at), archived_at=None,
        cancel_initiated_at=_time(batch.cancelling_at),
        results_url=f"{base_url.rstrip('/')}/v1/messages/batches/{batch.id}/results" if over else None)


def _time(seconds: int | None) -> str | None:
    """A stored time (epoch seconds), if any, as the RFC 3339 string Anthropic's objects carry."""
    return None if seconds is None else _rfc3339(seconds)


def _rfc3339(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _record(store: Store, bid: str) -> BatchRecord:
    batch = store.batch(bid)
    if batch is None or batch.format != MESSAGE_BATCH:
        raise ApiError(404, f"No Message Batch with id {bid!r} on this server (messages.batches.list lists them)",
                       "not_found")
    return batch


def _page(batches: list[BatchRecord], before_id: str | None, after_id: str | None,
          limit: int) -> tuple[list[BatchRecord], bool]:
    """A page of ``batches`` (newest first) strictly between the cursors (an unknown one: none),
    ``limit`` long: the last of that window before ``before_id`` (the page just before it), else
    its first; and whether more lie beyond the page in that direction."""
    ids = [b.id for b in batches]
    window = batches
    if after_id is not None:
        window = window[ids.index(after_id) + 1:] if after_id in ids else []
    if before_id is not None:
        inside = [b.id for b in window]
        window = window[:inside.index(before_id)] if before_id in inside else []
        return window[-limit:], len(window) > limit
    return window[:limit], len(window) > limit
