"""OpenAI's Batches API on ``sparkbatch serve-batch`` (:func:`batches_router`, included by
:func:`.app.make_app`): create a batch from an uploaded file, list, retrieve (with its progress
while it runs) and cancel. A Message Batch (``format`` ``anthropic_batch``) is not one of them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ..errors import ConfigError
from .guard import ApiError
from .openai_models import Batch, BatchCreate, BatchList, ErrorResponse
from .paging import links, page
from .store import OPEN, OPENAI_BATCH, Store, format_of, new_batch
from .worker import Worker

__all__ = ["batches_router"]


def batches_router(store: Store, worker: Worker) -> APIRouter:
    """The Batches routes on ``store`` and ``worker``."""
    router = APIRouter(prefix="/v1/batches")
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "no such object"}}

    @router.post("", response_model=Batch, operation_id="batches_create", responses=links(
        {"retrieve": ("batches_retrieve", {"batch_id": "id"}), "cancel": ("batches_cancel", {"batch_id": "id"}),
         "input": ("files_retrieve", {"file_id": "input_file_id"})}))
    def create_batch(body: BatchCreate) -> dict[str, Any]:
        try:
            batch = new_batch(store, body.model_dump())
        except ConfigError as exc:
            raise ApiError(400, str(exc), "invalid_request") from exc
        worker.submit(batch)
        return batch

    @router.get("", response_model=BatchList, operation_id="batches_list")
    def list_batches(after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
        return _listing(store, worker, after, limit)

    @router.get("/{batch_id}", response_model=Batch, responses=not_found, operation_id="batches_retrieve")
    def retrieve_batch(batch_id: str) -> dict[str, Any]:
        _batch(store, batch_id)
        return worker.progress(batch_id)

    @router.post("/{batch_id}/cancel", response_model=Batch, responses=not_found, operation_id="batches_cancel")
    def cancel_batch(batch_id: str) -> dict[str, Any]:
        _batch(store, batch_id)
        return worker.cancel(batch_id)

    return router


def _batch(store: Store, bid: str) -> dict[str, Any]:
    batch = store.batch(bid)
    if batch is None or format_of(batch) != OPENAI_BATCH:  # a Message Batch is not one
        raise ApiError(404, f"No such Batch object: {bid}", "not_found", "batch_id")
    return batch


def _listing(store: Store, worker: Worker, after: str | None, limit: int) -> dict[str, Any]:
    """``batches.list``: newest first, ``limit`` of them after the id ``after`` (unknown: none)."""
    listing = page([b for b in store.all_batches() if format_of(b) == OPENAI_BATCH], after, limit)
    listing["data"] = [worker.progress(b["id"]) if b["status"] in OPEN else b for b in listing["data"]]
    return listing
