"""The request and response models of Anthropic's Message Batches API as ``sparkbatch serve-batch``
serves it (:mod:`.anthropic_batches`), after Anthropic's API reference and the ``anthropic``
SDK's types (``anthropic.types.messages``): what a create takes, the ``MessageBatch`` object, a
list page, a deletion and an error. docs/batch-files.md has the field table a test checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Anthropic's ``custom_id``: 1 to 64 letters, digits, ``_`` or ``-``.
CUSTOM_ID = r"^[a-zA-Z0-9_-]{1,64}$"
#: The most requests one Message Batch takes (Anthropic's ``maxItems``).
MAX_REQUESTS = 100_000


class MessageParams(BaseModel):
    """A request's ``params`` (``messages.create``'s body): what Anthropic requires is checked at
    create; every other field is kept as sent, and the job runs it or makes it the request's
    ``errored`` result naming the field."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: Annotated[int, Field(ge=1, strict=True)]
    messages: list[dict[str, Any]]


class BatchRequestItem(BaseModel):
    """One request of a create: its ``custom_id`` (unique in the batch) and its ``params``."""

    custom_id: Annotated[str, Field(pattern=CUSTOM_ID, description="1 to 64 of a-z, A-Z, 0-9, _ and -")]
    params: MessageParams


class MessageBatchCreate(BaseModel):
    """``messages.batches.create``'s body."""

    requests: Annotated[list[BatchRequestItem], Field(min_length=1, max_length=MAX_REQUESTS)]


class MessageBatchRequestCounts(BaseModel):
    """Requests by status: all ``processing`` until the batch ends, then each in one of the
    others (Anthropic's: the counts move only once processing of the whole batch ends)."""

    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(BaseModel):
    """A Message Batch: times are RFC 3339 strings, ``results_url`` is set once it has ended."""

    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    ended_at: str | None
    created_at: str
    expires_at: str
    archived_at: str | None
    cancel_initiated_at: str | None
    results_url: str | None


class MessageBatchList(BaseModel):
    """``messages.batches.list``: a page, newest first; ``first_id``/``last_id`` are its cursors."""

    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedMessageBatch(BaseModel):
    """``messages.batches.delete``'s answer."""

    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Every refusal on the Message Batches routes: ``{"type": "error", "error": {...}, "request_id"}``."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
    request_id: str | None = None
