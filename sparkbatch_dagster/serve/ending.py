"""What a batch of ``sparkbatch serve-batch`` holds once it ends (:func:`ended`, the
:class:`.record.Changes` the worker writes): its result files, ``request_counts``, ``usage`` and
``model``, for either API it was created through.

- An OpenAI batch (``format`` ``openai_batch``): the output and error files are registered as
  files the client downloads; each request not run (a cancel, an expiry, a failed run) is an
  error line of the error file, counted in ``request_counts.failed``: every ``custom_id`` is in
  one file once, and ``completed + failed == total``.
- An Anthropic Message Batch (``format`` ``anthropic_batch``): one results file,
  ``<batch>/output.jsonl``, served by its ``results_url`` and never listed as a file; each request
  not run is a ``canceled`` / ``expired`` result (an ``errored`` one when the run failed), and how
  many is ``unrun_requests``, so that the Message Batch's counts can tell them from errors.
"""

from __future__ import annotations

from pathlib import Path

from ..run.batch_export import ExportSummary, Tally, Usage
from .openai_models import BatchError, BatchErrors, BatchUsage, InputTokensDetails, OutputTokensDetails, RequestCounts
from .record import MESSAGE_BATCH, BatchRecord, Changes, Ending, moved
from .results import add_unfinished
from .store import Store, now


def ended(store: Store, batch: BatchRecord, status: Ending, counts: ExportSummary | None,
          error: str | None) -> Changes:
    """What ends ``batch`` as ``status``, after its rows were exported (``counts``; None: nothing
    was sharded); ``error``: why the run failed."""
    anthropic = batch.format == MESSAGE_BATCH
    folder = store.folder(batch.id)
    output, errors = folder / "output.jsonl", folder / ("output.jsonl" if anthropic else "errors.jsonl")
    fields = moved(status, now())
    unrun = 0
    if status != "completed":  # whatever ended it, each request not answered is a line of its own
        unrun = add_unfinished(store.file_path(batch.input_file_id), output, errors, status, batch.format,
                               error or "")
    if counts is not None:
        fields.update(usage_fields(counts.usage))
    elif not anthropic:
        fields.update(usage_fields(NOTHING_RAN))
    written, failed = (counts.written, counts.errors) if counts is not None else (0, 0)
    # Every request is in one result line: the answers, the error rows, and those not run.
    fields["request_counts"] = RequestCounts(total=written + failed + unrun, completed=written, failed=failed + unrun)
    if anthropic:
        fields["unrun_requests"] = unrun  # canceled / expired (or errored) results, not the run's errors
    else:
        fields.update(_result_files(store, output, errors, status, counts, unrun))
    if error is not None:
        fields["errors"] = BatchErrors(data=(BatchError(code="run_failed", message=error),))
    return fields


def _result_files(store: Store, output: Path, errors: Path, status: Ending, counts: ExportSummary | None,
                  unrun: int) -> Changes:
    """An OpenAI batch's result files, registered as files (``output_file_id``, ``error_file_id``)."""
    fields: Changes = {}
    if counts is not None and (counts.written or status == "completed"):
        fields["output_file_id"] = store.add_file(output, "output.jsonl", "batch_output").id
    if (counts is not None and counts.errors) or unrun:
        fields["error_file_id"] = store.add_file(errors, "errors.jsonl", "batch_output").id
    return fields


#: The ``usage`` of a batch that ended with nothing run: it cost nothing (zeros, not a missing
#: ``usage`` that a client's ``batch.usage.total_tokens`` would trip over), and no model answered.
NOTHING_RAN = Usage(input_tokens=0, output_tokens=0, cached_tokens=0, reasoning_tokens=0, reused=0, model=None)


def counts_of(tally: Tally, batch: BatchRecord) -> RequestCounts:
    """``request_counts`` from an export's tally; before the job is sharded (no rows yet), the
    total stays the input's line count."""
    return RequestCounts(total=tally.rows or batch.request_counts.total, completed=tally.written, failed=tally.errors)


def usage_fields(usage: Usage) -> Changes:
    """The batch's fields for ``usage`` (OpenAI's shape: the tokens spent, a reused answer's none),
    ``model``, and how many answers were reused rather than generated (a field of this server's)."""
    return {"model": usage.model, "reused_requests": usage.reused,
            "usage": BatchUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                                total_tokens=usage.input_tokens + usage.output_tokens,
                                input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
                                output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens))}
