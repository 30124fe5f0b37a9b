"""The error lines of a batch's requests that never ran, as OpenAI writes them when a batch ends
early: expired (its completion window passed, code ``batch_expired``), cancelled (code
``batch_cancelled``) or failed (the run stopped, code ``batch_failed``). Each is ``{"id",
"custom_id", "response": null, "error": {"code", "message"}}``, so every request of the input
appears once in the result files, and the user can send the unfinished ones again by their
``custom_id``.

A request is named as the job names its row (:func:`job_row_ids`, the shard query's naming of
``inputs/ids.py``): a line the job could not read is ``unparsable-line-3`` in the error file, and
is not listed again under the ``custom_id`` a laxer reader would find in it.

For an Anthropic Message Batch (``fmt`` ``anthropic_batch``, one results file) each is Anthropic's
result of a request not run, ``{"custom_id", "result": {"type": "canceled"}}`` or ``{"type":
"expired"}``; after a failed run, an ``errored`` result (``api_error``) with the run's reason. Example::

    added = add_unfinished(Path("in.jsonl"), Path("output.jsonl"), Path("errors.jsonl"), "expired")
    added = add_unfinished(Path("in.jsonl"), Path("results.jsonl"), Path("results.jsonl"), "cancelled",
                           fmt="anthropic_batch")
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..inputs.files import SURROGATE, physical_lines
from .record import MESSAGE_BATCH, OPENAI_BATCH, Format

#: The line's error, by how the batch ended (OpenAI's documented batch_expired message).
REASONS = {"expired": ("batch_expired", "This request could not be executed before the completion window expired."),
           "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled first."),
           "failed": ("batch_failed", "This request was not executed: the batch's run failed first")}
#: Anthropic's result ``type`` of a request not run, by how the batch ended.
ANTHROPIC_TYPES: dict[str, str] = {"expired": "expired", "cancelled": "canceled"}


def add_unfinished(input_path: Path, output: Path, errors: Path, ending: str, fmt: Format = OPENAI_BATCH,
                   reason: str = "") -> int:
    """Append to ``errors`` (Anthropic's: the results file, ``errors`` == ``output``) a line for
    each request of ``input_path`` that neither result file holds; return how many. ``ending``:
    ``expired``, ``cancelled`` or ``failed`` (``reason``: why the run failed)."""
    done = {cid for path in dict.fromkeys((output, errors)) for cid in _ids_in(path)}  # Anthropic's: one file
    missing = [cid for cid in job_row_ids(input_path) if cid not in done]
    if not missing:
        return 0
    errors.parent.mkdir(parents=True, exist_ok=True)
    tmp = errors.with_name(f".{errors.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
        if errors.exists():  # copied as it is read: an error file may be as long as the batch
            with errors.open(encoding="utf-8") as old:
                shutil.copyfileobj(old, out)
        for cid in missing:
            line = _anthropic_line(cid, ending, reason) if fmt == MESSAGE_BATCH else \
                _openai_line(input_path, cid, ending, reason)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
    os.replace(tmp, errors)
    return len(missing)


def _openai_line(input_path: Path, cid: str, ending: str, reason: str) -> dict[str, Any]:
    code, message = REASONS[ending]
    if ending == "failed":
        message = f"{message} ({reason or 'see the server log'}): send it again in a new batch."
    uid = hashlib.sha256(f"{input_path.name}\x1e{cid}\x1e{ending}".encode()).hexdigest()[:24]
    return {"id": f"batch_req_{uid}", "custom_id": cid, "response": None, "error": {"code": code, "message": message}}


def _anthropic_line(cid: str, ending: str, reason: str) -> dict[str, Any]:
    if ending in ANTHROPIC_TYPES:
        return {"custom_id": cid, "result": {"type": ANTHROPIC_TYPES[ending]}}
    message = f"The batch's run failed before this request was answered: {reason or 'see the server log'}"
    return {"custom_id": cid, "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "api_error", "message": message}, "request_id": None}}}


def job_row_ids(path: Path) -> list[str]:
    """The row id the batch-file job gives each request line of ``path``, in order: the line's
    ``custom_id``; ``unparsable-line-<n>`` for a line whose id the job cannot read (not UTF-8, not
    strict JSON, no ``custom_id`` string); ``<id>#dup<k>`` for the k-th use of an id; a generated
    name that a real id holds takes ``~`` signs past the longest such id (``inputs/ids.py``: the
    shard query, which a property test holds this to)."""
    raw: list[tuple[str | None, int]] = []
    if not path.is_file():  # a Message Batch deleted meanwhile: no request left to name
        return []
    with path.open("rb") as fh:
        for n, text in physical_lines(fh):
            text = text.strip()  # as the job's reader: a line of Unicode whitespace is blank
            if text:
                raw.append((_line_id(text), n))
    longest: dict[str, int] = {}  # a real id with its '~' signs trimmed -> the longest such real id
    for cid, _ in raw:
        if cid is not None:
            trimmed = cid.rstrip("~")
            longest[trimmed] = max(longest.get(trimmed, 0), len(cid))
    real = {cid for cid, _ in raw if cid is not None}
    uses: Counter[str] = Counter()
    out: list[str] = []
    for cid, n in raw:
        if cid is not None:
            uses[cid] += 1
            if uses[cid] == 1:
                out.append(cid)
                continue
        generated = f"unparsable-line-{n}" if cid is None else f"{cid}#dup{uses[cid]}"
        out.append(generated + "~" * (longest[generated] - len(generated) + 1 if generated in real else 0))
    return out


def _line_id(text: str) -> str | None:
    """The ``custom_id`` the job reads from a line (``inputs/batch_input.read_line``'s), or None."""
    if SURROGATE.search(text):
        return None
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    cid = obj.get("custom_id") if isinstance(obj, dict) else None
    return cid if isinstance(cid, str) and cid else None


def _ids_in(path: Path) -> Iterator[str]:
    """The ``custom_id`` of each line of a JSONL file that has one (none when it is missing)."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            try:
                cid = json.loads(raw.decode("utf-8"), strict=False).get("custom_id")
            except (ValueError, AttributeError, RecursionError):
                continue
            if isinstance(cid, str) and cid:
                yield cid
