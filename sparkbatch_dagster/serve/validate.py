"""The input file's check while a batch is ``validating``, as OpenAI's Batch API makes it: a file
with a line that is not a JSON object, a line without a usable ``custom_id``, a ``custom_id``
used twice, or a ``url`` other than the batch's endpoint fails the whole batch, its ``errors``
naming each such line (OpenAI's codes: ``invalid_json_line``, ``duplicate_custom_id``,
``url_mismatch``, ``empty_file``). Nothing of it runs, so every result line a batch that passed
has is under an id the user sent.

What a single request gets wrong beyond that (an unsupported field, a temperature out of range)
is the request's own error line, as OpenAI answers it (:mod:`..run.batch_export`). Example::

    errors = validate_file(Path("requests.jsonl"), "/v1/chat/completions")   # [] when it may run

The file is read line by line, twice at most, and what is kept grows by 8 bytes a line (each
``custom_id``'s hash; the ids themselves only for the hashes seen twice): a file of millions of
short lines does not take the server's memory many times over.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .openai_models import BatchError

#: The errors a failed batch lists at most (OpenAI's ``errors.data``); the message of the last says how many more.
MAX_ERRORS = 1000


@dataclass(frozen=True)
class LineProblem:
    """One entry of a failed batch's ``errors.data``: ``line`` is the input's line (1-based)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None


class _Kept:
    """The first :data:`MAX_ERRORS` problems by line (one a line: a later finding replaces it),
    and how many lines had one."""

    def __init__(self) -> None:
        self.by_line: dict[int, LineProblem] = {}
        self._lines: list[int] = []  # a heap of -line: the last kept line is dropped first
        self.count = 0

    def add(self, n: int, problem: LineProblem) -> None:
        if n in self.by_line:
            self.by_line[n] = problem
            return
        self.count += 1
        if len(self.by_line) >= MAX_ERRORS and n > -self._lines[0]:
            return
        self.by_line[n] = problem
        heapq.heappush(self._lines, -n)
        if len(self.by_line) > MAX_ERRORS:
            del self.by_line[-heapq.heappop(self._lines)]


def validate_file(path: Path, endpoint: str) -> list[BatchError]:
    """The problems that fail a batch over ``path`` (``[]``: it may run), as ``errors.data`` entries."""
    kept = _Kept()
    hashes = array("q")  # each usable custom_id's hash, in line order
    lines = 0
    for n, obj in _objects(path):
        lines += 1
        problem = _check_line(obj, endpoint)
        if problem is not None:
            kept.add(n, replace(problem, line=n))
        if isinstance(obj, dict) and _usable(obj.get("custom_id")):
            hashes.append(_hash(obj["custom_id"]))
    if hashes:
        _find_repeats(path, hashes, kept)
    problems = [kept.by_line[n] for n in sorted(kept.by_line)]
    if not lines:
        problems.append(LineProblem("empty_file", "The input file has no request: upload a JSONL file with one "
                                    "request object per line"))
    if kept.count > MAX_ERRORS:
        rest = kept.count - MAX_ERRORS + 1
        problems = [*problems[:MAX_ERRORS - 1], LineProblem("too_many_errors", f"{rest} more lines have problems "
                                                            "like those above: fix them and upload the file again")]
    return [BatchError(**asdict(p)) for p in problems]


def _objects(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, the line's JSON value or None) of each non-blank line."""
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                # strict=False: a stray control byte inside a string (issue 49) is that request's
                # own error line, as the job reports it, not the whole file's fault.
                yield n, json.loads(raw.decode("utf-8"), strict=False)
            except (UnicodeDecodeError, ValueError, RecursionError):
                yield n, None


def _usable(cid: Any) -> bool:
    return isinstance(cid, str) and bool(cid)


def _hash(cid: str) -> int:
    return int.from_bytes(hashlib.blake2b(cid.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little",
                          signed=True)


def _find_repeats(path: Path, hashes: array[int], kept: _Kept) -> None:
    """A ``custom_id`` used again is a problem of each later line: hashes seen twice are found
    by sorting, then a second read names the lines (a hash shared by two ids is no repeat)."""
    import numpy as np

    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    twice = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    del ordered
    if not twice:
        return
    first: dict[str, int] = {}
    for n, obj in _objects(path):
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        if not isinstance(cid, str) or not cid or _hash(cid) not in twice:
            continue
        if cid in first:
            kept.add(n, LineProblem("duplicate_custom_id", f"The custom_id {cid!r} of this line is also line "
                                    f"{first[cid]}'s: each request needs its own custom_id.", n, "custom_id"))
        else:
            first[cid] = n


def _check_line(obj: Any, endpoint: str) -> LineProblem | None:
    """The problem of one line by itself (a repeated ``custom_id`` is found over the whole file)."""
    if not isinstance(obj, dict):
        return LineProblem("invalid_json_line", "This line is not parseable as a JSON object (one request per line).")
    if not _usable(obj.get("custom_id")):
        return LineProblem("missing_required_parameter", "This line has no custom_id (a non-empty string).",
                           param="custom_id")
    if obj.get("url") != endpoint:
        return LineProblem("url_mismatch", f"This line's url {obj.get('url')!r} is not the batch's endpoint "
                           f"{endpoint!r}: a batch runs one endpoint.", param="url")
    return None
