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
file's sums are the run's generated tokens; the summary adds them up (:func:`usage_of`). Example::

    summary = export(home, version, "openai_batch", Path("out.jsonl"), Path("errors.jsonl"))
    summary["written"], summary["errors"], summary["remaining"], summary["input_tokens"]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..home import JobHome
from .checkpoint import OUTPUT_SCHEMA

#: Row errors that are the request's fault: HTTP 400, as the provider answers them.
_CLIENT_ERRORS = ("bad_request", "unsupported", "unparsable_row", "invalid_text", "duplicate_id", "null_id",
                  "prompt_too_long", "too_long", "empty_text", "null_text", "bad_type", "render_error")
_LINE = re.compile(r"\bline (\d+)\b")


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


def _uid(*parts: str) -> str:
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:24]


def _kind(error: str) -> str:
    return error.split(":", 1)[0].strip() or "error"


def openai_line(row: dict[str, Any], version: str, created: int, usage: tuple[int, int]) -> dict[str, Any]:
    """One line of an OpenAI Batch output file (an answer) or error file (an error row)."""
    rid = row["row_id"]
    req = f"req_{_uid(version, rid, 'request')}"
    line: dict[str, Any] = {"id": f"batch_req_{_uid(version, rid)}", "custom_id": rid}
    if row["error"] is not None:
        kind, status = _kind(row["error"]), 400 if _kind(row["error"]).startswith(_CLIENT_ERRORS) else 500
        where = _LINE.search(row["error"])
        kind_of = "invalid_request_error" if status == 400 else "server_error"
        error: dict[str, Any] = {"error": {"message": row["error"], "type": kind_of, "param": None, "code": kind}}
        return {**line, "response": {"status_code": status, "request_id": req, "body": error},
                "error": {"code": kind, "message": row["error"], "line": int(where.group(1)) if where else None,
                          "param": None}}
    finish = row["finish_reason"] if row["finish_reason"] in ("stop", "length") else "stop"
    body: dict[str, Any] = {
        "id": f"chatcmpl-{_uid(version, rid, 'completion')}", "object": "chat.completion", "created": created,
        "model": row["model"], "system_fingerprint": version,
        "choices": [{"index": 0, "finish_reason": "length" if row["truncated"] else finish, "logprobs": None,
                     "message": {"role": "assistant", "content": row["output"], "refusal": None}}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }
    return {**line, "response": {"status_code": 200, "request_id": req, "body": body}, "error": None}


def anthropic_line(row: dict[str, Any], version: str, usage: tuple[int, int]) -> dict[str, Any]:
    """One line of an Anthropic Message Batches results file (``succeeded`` or ``errored``)."""
    rid = row["row_id"]
    if row["error"] is not None:
        client = _kind(row["error"]).startswith(_CLIENT_ERRORS)
        error = {"type": "invalid_request_error" if client else "api_error", "message": row["error"]}
        return {"custom_id": rid, "result": {"type": "errored", "error": {"type": "error", "error": error,
                                                                          "request_id": None}}}
    cut = row["truncated"] or row["finish_reason"] == "length"
    message = {"id": f"msg_{_uid(version, rid)}", "type": "message", "role": "assistant", "model": row["model"],
               "content": [{"type": "text", "text": row["output"]}],
               "stop_reason": "max_tokens" if cut else "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    return {"custom_id": rid, "result": {"type": "succeeded", "message": message}}


def export(home: JobHome, version: str, fmt: str, out: Path, errors: Path | None = None) -> dict[str, Any]:
    """Write the finished rows of ``version`` as ``fmt``'s result files (each replaced whole);
    return counts: ``written`` answers, ``errors``, ``remaining`` rows not finished yet, and
    :func:`usage_of` the rows (tokens, ``reused``, ``model``)."""
    manifest = home.read_manifest() or {"keys": [], "rows": 0}
    rows = list(finished_rows(home, version, manifest["keys"]))
    ok: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for row, when in rows:
        # Each row reports the tokens generated for it: a duplicate answered by another row's
        # generation, or an answer reused from the result store, reports zeros (it cost nothing
        # now), so the file's sums are the run's generated tokens.
        used = (int(row["prompt_tokens"] or 0), int(row["output_tokens"] or 0))
        line = openai_line(row, version, int(when), used) if fmt == "openai_batch" else \
            anthropic_line(row, version, used)
        (bad if row["error"] is not None else ok).append(line)
    _write(out, ok if errors is not None else ok + bad)
    if errors is not None:
        _write(errors, bad)
    return {**_summary(manifest, len(ok), len(bad)), **usage_of(row for row, _ in rows), "output_file": str(out),
            "error_file": str(errors or out)}


def usage_of(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the finished rows cost and who answered them: ``input_tokens``, ``output_tokens``,
    ``cached_tokens``, ``reasoning_tokens`` (every token the engine spent on them, an answer that
    then failed its check included; a reused answer's are zero), ``reused`` (answers not generated
    now: a duplicate's or the result store's) and ``model`` (the answering model, ``None`` before
    any answer)."""
    rows = list(rows)

    def total(column: str) -> int:
        return sum(int(r.get(column) or 0) for r in rows)

    return {"input_tokens": total("prompt_tokens"), "output_tokens": total("output_tokens"),
            "cached_tokens": total("cached_tokens"), "reasoning_tokens": total("reasoning_tokens"),
            "reused": sum(1 for r in rows if r["error"] is None and (r["reused"] or r["deduplicated"])),
            "model": next((r["model"] for r in rows if r["error"] is None and r["model"]), None)}


def tally(home: JobHome, version: str) -> dict[str, Any]:
    """The counts :func:`export` would return (``written``, ``errors``, ``remaining``, ``rows``,
    ``complete``), without writing any file: a progress poll's."""
    manifest = home.read_manifest() or {"keys": [], "rows": 0}
    errors = [row["error"] is not None for row, _ in finished_rows(home, version, manifest["keys"])]
    return _summary(manifest, len(errors) - sum(errors), sum(errors))


def _summary(manifest: dict[str, Any], written: int, errors: int) -> dict[str, Any]:
    total = int(manifest.get("rows") or 0)
    return {"written": written, "errors": errors, "remaining": total - written - errors, "rows": total,
            "complete": written + errors == total}


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    """The lines as JSONL, replacing ``path`` whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
