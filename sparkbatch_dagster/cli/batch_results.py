"""The error lines of a batch's requests that never ran, as OpenAI writes them when a batch ends
early: expired (its completion window passed, code ``batch_expired``) or cancelled (code
``batch_cancelled``). Each is ``{"id", "custom_id", "response": null, "error": {"code",
"message"}}``, so every request of the input appears once in the result files, and the user can
send the unfinished ones again by their ``custom_id``. Example::

    added = add_unfinished(Path("in.jsonl"), Path("output.jsonl"), Path("errors.jsonl"), "expired")
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

#: The line's error, by how the batch ended (OpenAI's documented batch_expired message).
REASONS = {"expired": ("batch_expired", "This request could not be executed before the completion window expired."),
           "cancelled": ("batch_cancelled", "This request was not executed: the batch was cancelled first.")}


def add_unfinished(input_path: Path, output: Path, errors: Path, ending: str) -> int:
    """Append to ``errors`` a line for each request of ``input_path`` that neither result file
    holds; return how many. ``ending``: ``expired`` or ``cancelled``."""
    code, message = REASONS[ending]
    done = {cid for path in (output, errors) for cid in _ids_in(path)}
    missing = [cid for cid in dict.fromkeys(_ids_in(input_path)) if cid not in done]
    if not missing:
        return 0
    errors.parent.mkdir(parents=True, exist_ok=True)
    tmp = errors.with_name(f".{errors.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
        if errors.exists():
            out.write(errors.read_text(encoding="utf-8"))
        for cid in missing:
            uid = hashlib.sha256(f"{input_path.name}\x1e{cid}\x1e{ending}".encode()).hexdigest()[:24]
            out.write(json.dumps({"id": f"batch_req_{uid}", "custom_id": cid, "response": None,
                                  "error": {"code": code, "message": message}}, ensure_ascii=False) + "\n")
    os.replace(tmp, errors)
    return len(missing)


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
