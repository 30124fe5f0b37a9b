"""OpenAI's Batches API on ``sparkbatch serve-batch`` (:func:`batches_router`, included by
:func:`.app.make_app`): create a batch from an uploaded file, list, retrieve (with its progress
while it runs) and cancel. A Message Batch (``format`` ``anthropic_batch``) is not one of them.
A stored batch (:class:`.record.BatchRecord`) is rendered as OpenAI's Batch object in one place,
:func:`openai_batch`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ..errors import ConfigError
from .guard import ApiError
from .openai_models import Batch, BatchCreate, BatchList, ErrorResponse
from .paging import links, page
from .record import OPENAI_BATCH, BatchRecord
from .store import Store, new_batch
from .worker import Worker

__all__ = ["batches_router", "openai_batch"]


def batches_router(store: Store, worker: Worker) -> APIRouter:
    """The Batches routes on ``store`` and ``worker``."""
    router = APIRouter(prefix="/v1/batches")
    not_found: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "no such object"}}

    @router.post("", response_model=Batch, operation_id="batches_create", responses=links(
        {"retrieve": ("batches_retrieve", {"batch_id": "id"}), "cancel": ("batches_cancel", {"batch_id": "id"}),
         "input": ("files_retrieve", {"file_id": "input_file_id"})}))
    def create_batch(body: BatchCreate) -> Batch:
        try:
            batch = new_batch(store, body.model_dump())
        except ConfigError as exc:
            raise ApiError(400, str(exc), "invalid_request") from exc
        worker.submit(batch)
        return openai_batch(batch)

    @router.get("", response_model=BatchList, operation_id="batches_list")
    def list_batches(after: Annotated[str | None, Query(description="the last id of the previous page")] = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> BatchList:
        chosen, more = page([b for b in store.all_batches() if b.format == OPENAI_BATCH], after, limit)
        return BatchList.of([openai_batch((worker.progress(b.id) or b) if b.is_open else b) for b in chosen], more)

    @router.get("/{batch_id}", response_model=Batch, responses=not_found, operation_id="batches_retrieve")
    def retrieve_batch(batch_id: str) -> Batch:
        batch = _batch(store, batch_id)
        return openai_batch(worker.progress(batch_id) or batch)

    @router.post("/{batch_id}/cancel", response_model=Batch, responses=not_found, operation_id="batches_cancel")
    def cancel_batch(batch_id: str) -> Batch:
        _batch(store, batch_id)
        return openai_batch(worker.cancel(batch_id))

    return router


def openai_batch(batch: BatchRecord) -> Batch:
    """The Batch object of a stored batch: the record's fields that OpenAI's Batch names (not its
    own ``format`` and ``unrun_requests``)."""
    return Batch.model_validate({name: getattr(batch, name) for name in Batch.model_fields if name != "object"})


def _batch(store: Store, bid: str) -> BatchRecord:
    batch = store.batch(bid)
    if batch is None or batch.format != OPENAI_BATCH:  # a Message Batch is not one
        raise ApiError(404, f"No such Batch object: {bid}", "not_found", "batch_id")
    return batch
