"""A batch of ``sparkbatch serve-batch`` as the store keeps it: :class:`BatchRecord`, one typed,
frozen record for both APIs, and :class:`Changes`, what one update may set.

An OpenAI Batch and an Anthropic Message Batch are two views of one entry of the server's queue:
one worker runs both, one ending (:mod:`.ending`) closes both. So the store holds one record, the
fields either view needs, and each router renders its API's object from it in one function
(:func:`.openai_batches.openai_batch`, :func:`.anthropic_batches.message_batch`); a field read or
set under a wrong name, or a status no API has, is an error where it is written (mypy, pydantic),
not a key a client misses later.

On disk the record is the JSON earlier servers wrote: an OpenAI Batch object's fields (a Message
Batch's record with ``"format": "anthropic_batch"`` and fewer of them). A field an old record
lacks takes its default and a key the record does not name (the Batch's ``"object"``) is dropped,
so an old ``--root`` loads (``tests/unit/test_batch_store.py``). The nested parts are the Batch
object's own models (:mod:`.openai_models`: ``request_counts``, ``errors``, ``usage``).
"""

from __future__ import annotations

from typing import Literal, TypedDict, cast

from pydantic import BaseModel, ConfigDict
from typing_extensions import Unpack

from .openai_models import BatchErrors, BatchStatus, BatchUsage, RequestCounts

#: Which API made the batch, and so its job's input format.
Format = Literal["openai_batch", "anthropic_batch"]
OPENAI_BATCH: Format = "openai_batch"
MESSAGE_BATCH: Format = "anthropic_batch"
#: How a batch ends; each is a status, its time in the field named after it (``cancelled_at``).
Ending = Literal["completed", "failed", "cancelled", "expired"]
#: A batch in one of these has not ended: a restarted server takes it up again.
OPEN: tuple[BatchStatus, ...] = ("validating", "in_progress", "finalizing", "cancelling")
#: The one endpoint an OpenAI batch runs.
ENDPOINT = "/v1/chat/completions"


class BatchRecord(BaseModel):
    """One batch: its ids, status and the time of each status, counts, errors, usage, and which
    API made it (``format``). ``unrun_requests``: a Message Batch's requests that never ran (its
    ``canceled`` / ``expired`` results, told apart from errors in its counts)."""

    model_config = ConfigDict(frozen=True)
    id: str
    endpoint: str = ENDPOINT
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: Literal["24h"] = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None
    model: str | None = None
    request_counts: RequestCounts = RequestCounts(total=0, completed=0, failed=0)
    usage: BatchUsage | None = None
    reused_requests: int | None = None
    format: Format = OPENAI_BATCH
    unrun_requests: int = 0

    @property
    def is_open(self) -> bool:
        """Whether it has not ended (:data:`OPEN`)."""
        return self.status in OPEN

    def at(self, status: BatchStatus) -> int | None:
        """When it moved to ``status`` (None: not yet, or a status with no time of its own)."""
        return cast(int | None, getattr(self, f"{status}_at", None))

    def changed(self, **changes: Unpack[Changes]) -> BatchRecord:
        """A copy with ``changes``, checked as a loaded record is (a wrong type raises)."""
        unknown = set(changes) - set(type(self).model_fields)
        if unknown:  # a TypedDict passed on from elsewhere may carry keys mypy did not see
            raise TypeError(f"a batch has no field {sorted(unknown)}")
        return type(self).model_validate({**self.model_dump(), **changes})


class Changes(TypedDict, total=False):
    """What :meth:`BatchRecord.changed` (and so ``Store.update``) may set: every field but ``id``
    (tests/unit/test_batch_store.py holds the two lists together)."""

    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: Literal["24h"]
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    metadata: dict[str, str] | None
    model: str | None
    request_counts: RequestCounts
    usage: BatchUsage | None
    reused_requests: int | None
    format: Format
    unrun_requests: int


def moved(status: Ending | Literal["in_progress", "finalizing", "cancelling"], at: int) -> Changes:
    """The change to ``status`` at ``at``: the status, and its time in the field named after it."""
    return cast(Changes, {"status": status, f"{status}_at": at})
