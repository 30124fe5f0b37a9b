"""A batch-file job's rows as the provider's result files: the OpenAI Batch output and error
files, or an Anthropic Message Batches results file.

Every row of the job is written once: an answer to the output file, an error row (a line that
could not run, a repeated ``custom_id``, a prompt too long, an answer that broke its schema) to
the error file (the output file when no error file is given, as ``vllm run-batch`` and Anthropic
do). ``custom_id`` is the row id: the line's own, or for a line that had none usable the name
the job gave it (``unparsable-line-7``, ``a#dup2``), so a line is never lost. While the job runs
(or after a cancel) the rows finished so far are written, committed partitions and the
checkpointed rows of the others alike, and the summary says how many remain. Each line's
``usage`` is the tokens generated for that row (a duplicate's or a reused answer's: zero), so the
file's sums are the run's generated tokens; the summary adds them up (:func:`usage_of`). The
counts are typed records (:class:`Tally`, :class:`Usage`, :class:`ExportSummary`); ``to_json()``
gives the dict the CLI prints. Example::

    summary = export(home, version, "openai_batch", Path("out.jsonl"), Path("errors.jsonl"))
    summary.written, summary.errors, summary.remaining, summary.input_tokens
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from ..home import JobHome
from .batch_errors import anthropic_message, is_client_error, openai_error
from .batch_lines import (
    AnthropicResultLine,
    ApiError,
    ChatCompletion,
    CompletionUsage,
    ErrorBody,
    ErrorDetail,
    Errored,
    ErrorResponse,
    Message,
    MessageUsage,
    OpenAIResultLine,
    Response,
    ResultLine,
    Succeeded,
    anthropic_content,
    anthropic_stop,
    openai_choices,
)
from .checkpoint import OUTPUT_SCHEMA


def finished_rows(home: JobHome, version: str, keys: list[str]) -> Iterator[tuple[dict[str, Any], float]]:
    """(output row, when it was written) of every finished row: a committed partition's, else the
    rows its checkpoint parts hold so far (a running or cancelled job's)."""
    import pyarrow.parquet as pq

    for key in keys:
        if home.is_done(version, key):
            path = home.labeled_path(version, key)
            files = [path]
        else:  # whole parts only: a part is written under a temporary name, then renamed
            files = sorted(home.parts_dir(version, key).glob("part-*.parquet"))
        seen: set[str] = set()
        for f in files:
            try:
                table, when = pq.read_table(f, schema=OUTPUT_SCHEMA), f.stat().st_mtime
            except (OSError, ValueError):  # committed or dropped meanwhile: its rows come in the next export
                continue
            for row in table.to_pylist():
                if row["row_id"] not in seen:
                    seen.add(row["row_id"])
                    yield row, when


class Tally(msgspec.Struct, frozen=True, kw_only=True):
    """Where a batch-file job's rows stand: ``written`` answers, ``errors`` (error rows),
    ``remaining`` rows not finished yet, of ``rows``; ``complete`` when none remains."""

    written: int
    errors: int
    remaining: int
    rows: int
    complete: bool

    def to_json(self) -> dict[str, Any]:
        """The counts as the CLI and ``serve-batch`` give them."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """What finished rows cost and who answered them (:func:`usage_of`)."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    reused: int
    model: str | None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class ExportSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`export` wrote: the :class:`Tally` of the rows, their :class:`Usage`, and the
    files (``error_file`` is ``output_file`` when errors went in with the answers)."""

    tally: Tally
    usage: Usage
    output_file: str
    error_file: str

    @property
    def written(self) -> int:
        return self.tally.written

    @property
    def errors(self) -> int:
        return self.tally.errors

    @property
    def remaining(self) -> int:
        return self.tally.remaining

    @property
    def complete(self) -> bool:
        return self.tally.complete

    def to_json(self) -> dict[str, Any]:
        """One flat object, as ``sparkbatch export-batch`` prints it."""
        return {**self.tally.to_json(), **self.usage.to_json(), "output_file": self.output_file,
                "error_file": self.error_file}


def _uid(*parts: str) -> str:
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:24]


def _call_key(job: str, version: str, rid: str) -> str:
    """What names a row's tool calls: the batch (its job's home), the output version and the request."""
    return json.dumps([job, version, rid])


def openai_line(row: dict[str, Any], version: str, created: int, usage: tuple[int, int],
                job: str = "") -> OpenAIResultLine:
    """One line of an OpenAI Batch output file (an answer) or error file (an error row); ``job``
    names the batch (its home), so its tool calls' ids are its own."""
    rid = row["row_id"]
    req = f"req_{_uid(version, rid, 'request')}"
    line_id = f"batch_req_{_uid(version, rid)}"
    if row["error"] is not None:
        # The request's own failure is its HTTP answer (400: its fault; 500: the engine's), with the
        # line's ``error`` null: OpenAI keeps that for requests that got no HTTP answer at all
        # (``batch_expired``, ``batch_cancelled``: serve/results.py writes those).
        kind, code, param = openai_error(row["error"])
        status = 400 if kind == "invalid_request_error" else 500
        error = ApiError(message=row["error"], type=kind, param=param, code=code)
        return OpenAIResultLine(id=line_id, custom_id=rid,
                                response=Response(status_code=status, request_id=req, body=ErrorBody(error=error)),
                                error=None)
    cut = row["truncated"] or row["finish_reason"] == "length"
    body = ChatCompletion(
        id=f"chatcmpl-{_uid(version, rid, 'completion')}", created=created, model=row["model"],
        system_fingerprint=version,
        choices=openai_choices(row["output"], cut, row["extra"], _call_key(job, version, rid)),
        usage=CompletionUsage(prompt_tokens=usage[0], completion_tokens=usage[1], total_tokens=sum(usage)))
    return OpenAIResultLine(id=line_id, custom_id=rid, response=Response(status_code=200, request_id=req, body=body),
                            error=None)


def anthropic_line(row: dict[str, Any], version: str, usage: tuple[int, int], job: str = "",
                   cite_requests: bool = False) -> AnthropicResultLine:
    """One line of an Anthropic Message Batches results file (``succeeded`` or ``errored``);
    ``job`` as for :func:`openai_line`; ``cite_requests``: an error names the request of a
    Message Batch (``requests.3.params...``), not a line of the server's file of them."""
    rid = row["row_id"]
    if row["error"] is not None:
        detail = ErrorDetail(type="invalid_request_error" if is_client_error(row["error"]) else "api_error",
                             message=anthropic_message(row["error"], cite_requests))
        return AnthropicResultLine(custom_id=rid, result=Errored(error=ErrorResponse(error=detail)))
    cut = row["truncated"] or row["finish_reason"] == "length"
    stop_reason, stop = anthropic_stop(cut, row["extra"])
    message = Message(id=f"msg_{_uid(version, rid)}", model=row["model"],
                      content=anthropic_content(row["output"], row["extra"], _call_key(job, version, rid)),
                      stop_reason=stop_reason,
                      stop_sequence=stop,
                      usage=MessageUsage(input_tokens=usage[0], output_tokens=usage[1]))
    return AnthropicResultLine(custom_id=rid, result=Succeeded(message=message))


def export(home: JobHome, version: str, fmt: str, out: Path, errors: Path | None = None,
           cite_requests: bool = False) -> ExportSummary:
    """Write the finished rows of ``version`` as ``fmt``'s result files (each replaced whole);
    return counts: ``written`` answers, ``errors``, ``remaining`` rows not finished yet, and
    :func:`usage_of` the rows (tokens, ``reused``, ``model``). ``cite_requests``: as
    :func:`anthropic_line`'s (a Message Batch made through ``serve-batch``)."""
    manifest = home.read_manifest() or {"keys": [], "rows": 0}
    rows = list(finished_rows(home, version, manifest["keys"]))
    ok: list[ResultLine] = []
    bad: list[ResultLine] = []
    for row, when in rows:
        # Each row reports the tokens generated for it: a duplicate answered by another row's
        # generation, or an answer reused from the result store, reports zeros (it cost nothing
        # now), so the file's sums are the run's generated tokens.
        used = (int(row["prompt_tokens"] or 0), int(row["output_tokens"] or 0))
        line: ResultLine = openai_line(row, version, int(when), used, str(home.root)) if fmt == "openai_batch" \
            else anthropic_line(row, version, used, str(home.root), cite_requests)
        (bad if row["error"] is not None else ok).append(line)
    _write(out, ok if errors is not None else ok + bad)
    if errors is not None:
        _write(errors, bad)
    return ExportSummary(tally=_summary(manifest, len(ok), len(bad)), usage=usage_of(row for row, _ in rows),
                         output_file=str(out), error_file=str(errors or out))


def usage_of(rows: Iterable[dict[str, Any]]) -> Usage:
    """What the finished rows cost and who answered them: ``input_tokens``, ``output_tokens``,
    ``cached_tokens``, ``reasoning_tokens`` (every token the engine spent on them, an answer that
    then failed its check included; a reused answer's are zero), ``reused`` (answers not generated
    now: a duplicate's or the result store's) and ``model`` (the answering model, ``None`` before
    any answer)."""
    rows = list(rows)

    def total(column: str) -> int:
        return sum(int(r.get(column) or 0) for r in rows)

    return Usage(input_tokens=total("prompt_tokens"), output_tokens=total("output_tokens"),
                 cached_tokens=total("cached_tokens"), reasoning_tokens=total("reasoning_tokens"),
                 reused=sum(1 for r in rows if r["error"] is None and (r["reused"] or r["deduplicated"])),
                 model=next((r["model"] for r in rows if r["error"] is None and r["model"]), None))


def tally(home: JobHome, version: str) -> Tally:
    """The counts :func:`export` would return (``written``, ``errors``, ``remaining``, ``rows``,
    ``complete``), without writing any file: a progress poll's."""
    manifest = home.read_manifest() or {"keys": [], "rows": 0}
    errors = [row["error"] is not None for row, _ in finished_rows(home, version, manifest["keys"])]
    return _summary(manifest, len(errors) - sum(errors), sum(errors))


def _summary(manifest: dict[str, Any], written: int, errors: int) -> Tally:
    total = int(manifest.get("rows") or 0)
    return Tally(written=written, errors=errors, remaining=total - written - errors, rows=total,
                 complete=written + errors == total)


def _write(path: Path, lines: list[ResultLine]) -> None:
    """The lines as JSONL, replacing ``path`` whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line.to_json(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
