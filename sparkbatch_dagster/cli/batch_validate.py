"""The input file's check while a batch is ``validating``, as OpenAI's Batch API makes it: a file
with a line that is not a JSON object, a line without a usable ``custom_id``, a ``custom_id``
used twice, or a ``url`` other than the batch's endpoint fails the whole batch, its ``errors``
naming each such line (OpenAI's codes: ``invalid_json_line``, ``duplicate_custom_id``,
``url_mismatch``, ``empty_file``). Nothing of it runs, so every result line a batch that passed
has is under an id the user sent.

What a single request gets wrong beyond that (an unsupported field, a temperature out of range)
is the request's own error line, as OpenAI answers it (:mod:`..run.batch_export`). Example::

    errors = validate_file(Path("requests.jsonl"), "/v1/chat/completions")   # [] when it may run
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: The errors a failed batch lists at most (OpenAI's ``errors.data``); the message of the last says how many more.
MAX_ERRORS = 1000


@dataclass(frozen=True)
class LineProblem:
    """One entry of a failed batch's ``errors.data``: ``line`` is the input's line (1-based)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


def validate_file(path: Path, endpoint: str) -> list[dict[str, Any]]:
    """The problems that fail a batch over ``path`` (``[]``: it may run), as ``errors.data`` entries."""
    problems: list[LineProblem] = []
    seen: dict[str, int] = {}
    lines = 0
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            lines += 1
            problem = _check_line(raw, n, endpoint, seen)
            if problem is not None:
                problems.append(problem)
    if not lines:
        problems.append(LineProblem("empty_file", "The input file has no request: upload a JSONL file with one "
                                    "request object per line"))
    if len(problems) > MAX_ERRORS:
        rest = len(problems) - MAX_ERRORS + 1
        problems = [*problems[:MAX_ERRORS - 1], LineProblem("too_many_errors", f"{rest} more lines have problems "
                                                            "like those above: fix them and upload the file again")]
    return [asdict(p) for p in problems]


def _check_line(raw: bytes, n: int, endpoint: str, seen: dict[str, int]) -> LineProblem | None:
    try:
        # strict=False: a stray control byte inside a string (issue 49) is that request's own
        # error line, as the job reports it, not the whole file's fault.
        obj = json.loads(raw.decode("utf-8"), strict=False)
    except (UnicodeDecodeError, ValueError, RecursionError):
        obj = None
    if not isinstance(obj, dict):
        return LineProblem("invalid_json_line", "This line is not parseable as a JSON object (one request per line).",
                           n)
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return LineProblem("missing_required_parameter", "This line has no custom_id (a non-empty string).", n,
                           "custom_id")
    if cid in seen:
        return LineProblem("duplicate_custom_id", f"The custom_id {cid!r} of this line is also line {seen[cid]}'s: "
                           "each request needs its own custom_id.", n, "custom_id")
    seen[cid] = n
    if obj.get("url") != endpoint:
        return LineProblem("url_mismatch", f"This line's url {obj.get('url')!r} is not the batch's endpoint "
                           f"{endpoint!r}: a batch runs one endpoint.", n, "url")
    return None
