"""The request and response models of ``sparkbatch serve-batch`` (:mod:`.app`): the
shapes of OpenAI's Files and Batches API that the server takes and gives, and so its OpenAPI
document (``/openapi.json``).

A stored batch is a :class:`.record.BatchRecord`, rendered as a :class:`Batch` by
:func:`.openai_batches.openai_batch`; the parts of a Batch the record holds as they are
(``request_counts``, ``errors``, ``usage``) are frozen, as the record is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from typing_extensions import Self

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]


class ErrorDetail(BaseModel):
    """OpenAI's error: ``message`` says what is wrong and the fix, ``param`` the field at fault."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every refusal's body, whatever the status: ``{"error": {...}}``."""

    error: ErrorDetail


class FileObject(BaseModel):
    """``files.create`` and ``files.retrieve``: an uploaded input file or a batch's result file."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str | None = None
    expires_at: int | None = None
    status_details: str | None = None


class _Page(BaseModel):
    """What every OpenAI list page carries besides its ``data``."""

    object: Literal["list"] = "list"
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool

    @classmethod
    def of(cls, data: Sequence[Any], has_more: bool) -> Self:
        """The page of ``data`` (objects with an ``id``, :func:`.paging.page`'s), its cursors their first and last."""
        return cls.model_validate({"data": list(data), "first_id": data[0].id if data else None,
                                   "last_id": data[-1].id if data else None, "has_more": has_more})


class FileList(_Page):
    """``files.list``: a page of files, in the ``order`` asked."""

    data: list[FileObject]


class FileDeleted(BaseModel):
    """``files.delete``'s answer."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool


#: OpenAI's ``metadata``: keys of at most 64 characters, string values of at most 512 (a client
#: parses a value of another type as an error, so one is refused when the batch is created).
Metadata = dict[Annotated[str, StringConstraints(max_length=64)], Annotated[str, StringConstraints(max_length=512)]]


class BatchCreate(BaseModel):
    """``batches.create``'s body; other fields the client sends are ignored."""

    input_file_id: str = Field(description="an uploaded file's id (files.create with purpose 'batch')")
    endpoint: Literal["/v1/chat/completions"] = Field(description="the only endpoint served here")
    completion_window: Literal["24h"] = "24h"
    metadata: Metadata | None = Field(None, max_length=16, description="up to 16 pairs of strings, as OpenAI's")


class _Frozen(BaseModel):
    """A part of a Batch that a stored record holds too: it never changes in place."""

    model_config = ConfigDict(frozen=True)


class RequestCounts(_Frozen):
    total: int
    completed: int
    failed: int


class BatchError(_Frozen):
    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(_Frozen):
    object: str = "list"
    data: tuple[BatchError, ...] = ()


class InputTokensDetails(_Frozen):
    cached_tokens: int = 0


class OutputTokensDetails(_Frozen):
    reasoning_tokens: int = 0


class BatchUsage(_Frozen):
    """The tokens the batch's answers cost: an answer reused (an identical request answered
    before, not generated again) counts none, so the sums equal what the engine generated."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class Batch(BaseModel):
    """A Batch object as OpenAI's client parses it; ``request_counts`` follow the run's finished rows."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, Any] | None = None
    model: str | None = None
    request_counts: RequestCounts | None = None
    usage: BatchUsage | None = None
    reused_requests: int | None = Field(None, description="this server's: answers reused from its answer store "
                                        "(or another line of the batch), not generated for this batch")


class BatchList(_Page):
    """``batches.list``: a page, newest first."""

    data: list[Batch]
