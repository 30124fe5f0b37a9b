"""The accounting invariant of a batch that has ended (issue 59): every request of its input is in
one result line, once, and its counts add up. :func:`check_ended` holds a batch of a
``serve-batch`` store to it, whichever API made it; :func:`random_file` writes the random files
the seeded tests end at random points (tests/e2e/test_batch_accounting.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

#: ids that collide with the names the job generates (``#dup``, ``unparsable-line-``, ``~`` signs).
IDS = ("r1", "r2", "r3", "r1#dup2", "r1#dup2~", "unparsable-line-2", "r2#dup2")


def request_line(cid: str | None, fmt: str, text: str, **more: Any) -> str:
    """A request line of ``fmt`` (``custom_id`` left out when ``cid`` is None)."""
    messages = [{"role": "user", "content": text}]
    line: dict[str, Any] = {"method": "POST", "url": "/v1/chat/completions",
                            "body": {"messages": messages, "max_tokens": 4}} if fmt == "openai_batch" \
        else {"params": {"model": "m", "max_tokens": 4, "messages": messages}}
    if cid is not None:
        line["custom_id"] = cid
    return json.dumps({**line, **more})


def random_file(rng: random.Random, fmt: str, path: Path) -> None:
    """1 to 24 lines of every kind a file may hold: requests, repeated ids and ids the job would
    generate, a raw NUL inside a string, a line that is no JSON or has no id, an unknown field,
    blank lines and a line of Unicode whitespace only."""
    lines = []
    for i in range(rng.randint(1, 24)):
        cid = rng.choice(IDS) if rng.random() < 0.5 else f"q{i}"
        kind = rng.choices(["ok", "nul", "junk", "noid", "field", "blank"], [10, 1, 1, 1, 1, 1])[0]
        if kind == "ok":
            lines.append(request_line(cid, fmt, f"text {rng.randint(0, 5)}"))
        elif kind == "nul":
            lines.append(request_line(cid, fmt, "a\\u0000b").replace("\\\\u0000", "\x00"))
        elif kind == "junk":
            lines.append(rng.choice(["{oops", "[1, 2]", '"text"', "null"]))
        elif kind == "noid":
            lines.append(request_line(None, fmt, "no id"))
        elif kind == "field":
            lines.append(request_line(cid, fmt, "x", extra_field=1))
        else:
            lines.append(rng.choice(["", "   ", "\x1c", "\u3000"]))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def requests_in(path: Path) -> tuple[int, list[str]]:
    """(how many requests the file holds: its lines that are not blank, as the job reads them; the
    ``custom_id`` of each line a strict JSON reader reads one from)."""
    count, ids = 0, []
    for raw in path.read_bytes().split(b"\n"):
        text = raw.decode("utf-8", "surrogateescape").strip()
        if not text:
            continue
        count += 1
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str) and obj["custom_id"]:
            ids.append(obj["custom_id"])
    return count, ids


def result_lines(store: Any, batch: Any) -> list[dict[str, Any]]:
    """Every result line of an ended batch: its output and error files (a Message Batch: its one file)."""
    paths = [store.folder(batch.id) / "output.jsonl"] if batch.format == "anthropic_batch" else \
        [store.file_path(fid) for fid in (batch.output_file_id, batch.error_file_id) if fid]
    return [json.loads(x) for p in paths if p.exists() for x in p.read_text(encoding="utf-8").splitlines()]


def answered(line: dict[str, Any]) -> bool:
    """Whether a result line is an answer (OpenAI: a 200 response; Anthropic: ``succeeded``)."""
    if "result" in line:
        return bool(line["result"]["type"] == "succeeded")
    return line.get("response") is not None and line["response"]["status_code"] == 200


def check_ended(store: Any, bid: str) -> None:
    """Assert the invariant on batch ``bid`` of ``store`` (ended): one result line per request,
    under distinct ids, every id a strict reader finds among them, ``request_counts`` the lines'."""
    batch = store.batch(bid)
    count, ids = requests_in(store.file_path(batch.input_file_id))
    lines = result_lines(store, batch)
    got = [line["custom_id"] for line in lines]
    assert len(got) == len(set(got)), f"a custom_id in two result lines: {sorted(got)}"
    assert len(got) == count, f"{count} requests, {len(got)} result lines: {sorted(got)}"
    assert set(ids) <= set(got), f"requests in no result line: {sorted(set(ids) - set(got))}"
    counts = batch.request_counts
    ok = sum(answered(line) for line in lines)
    assert (counts.total, counts.completed, counts.failed) == (count, ok, count - ok), (counts, count, ok)
