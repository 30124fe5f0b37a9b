"""What the Message Batches tests (tests/e2e/test_anthropic_batches.py) check every object and
line against: the field tables of docs/batch-files.md's "Anthropic's Message Batches API on the
box" (:func:`field_table`), the ``anthropic`` SDK's own types in strict mode (:func:`conforms`,
:func:`result_lines`), and the requests they send (:func:`message_requests`)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "batch-files.md"
SECTION = "## Anthropic's Message Batches API on the box"
#: A table's type column, as the JSON value it allows (null aside).
TYPES: dict[str, type] = {"string": str, "RFC 3339 string": str, "object": dict, "integer": int}


def message_requests(n: int, prefix: str = "req", bad: bool = True) -> list[dict[str, Any]]:
    """``n`` requests ``<prefix>-<i>`` (8 tokens each, one prompt per id), and with ``bad`` one
    more, ``bad-0``, whose temperature no model takes: the job's ``errored`` result."""
    requests = [{"custom_id": f"{prefix}-{i}", "params": {
        "model": "claude-any", "max_tokens": 8, "messages": [{"role": "user", "content": f"Question {i}?"}]}}
        for i in range(n)]
    if bad:
        requests.append({"custom_id": "bad-0", "params": {"model": "claude-any", "max_tokens": 8, "temperature": 9,
                                                          "messages": [{"role": "user", "content": "x"}]}})
    return requests


def field_table(title: str) -> dict[str, tuple[str, str]]:
    """The doc's table whose first header cell is ``title``: field -> (type, set here in)."""
    section = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    inside = False
    for line in section.splitlines():
        if line.startswith(f"| {title} |"):
            inside = True
        elif inside and not line.startswith("|"):
            break
        elif inside and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = (cells[1], cells[3])
    assert rows, f"no table {title!r} in {DOC}"
    return rows


def _may_be(set_in: str, status: str) -> tuple[bool, bool]:
    """(may be null, may be set) in ``status``, from a *set here in* cell."""
    if set_in.startswith("all"):
        return set_in.startswith("all*"), True
    if set_in.startswith("none"):
        return True, False
    listed = dict(re.findall(r"`(\w+)(\*?)`", set_in.split("(", 1)[0]))
    if status not in listed:
        return True, False
    return listed[status] == "*", True


def conforms(text: str) -> Any:
    """A MessageBatch's raw JSON checked field by field against the doc's tables (exactly those
    fields, of those types, set in those statuses), then parsed by the SDK in strict mode. (Strict
    JSON validation: the times are RFC 3339 strings, which strict Python-mode validation of a dict
    refuses for a ``datetime`` field.)"""
    from anthropic.types.messages import MessageBatch, MessageBatchRequestCounts

    raw = json.loads(text)
    table, counts = field_table("MessageBatch field"), field_table("request_counts field")
    assert set(raw) == set(table) == set(MessageBatch.model_fields), (sorted(raw), sorted(table))
    assert set(raw["request_counts"]) == set(counts) == set(MessageBatchRequestCounts.model_fields)
    status = raw["processing_status"]
    for name, (kind, set_in) in [*table.items(), *((f"request_counts.{k}", v) for k, v in counts.items())]:
        value = raw["request_counts"][name.split(".")[1]] if "." in name else raw[name]
        nullable, settable = _may_be(set_in, status)
        assert value is not None or nullable, f"{name} is null while {status}"
        assert value is None or settable, f"{name} is {value!r} while {status}"
        if value is not None:
            assert isinstance(value, TYPES[kind]) and not isinstance(value, bool), f"{name}: {value!r} is no {kind}"
            if kind == "RFC 3339 string":
                assert datetime.fromisoformat(value).tzinfo is not None, f"{name}: {value!r}"
    assert sum(raw["request_counts"].values()) > 0
    return MessageBatch.model_validate_json(text, strict=True)


def result_lines(body: bytes) -> dict[str, Any]:
    """A results file's lines, each parsed by the SDK in strict mode: custom_id -> its result
    (every custom_id once)."""
    from anthropic.types.messages import MessageBatchIndividualResponse

    parsed = [MessageBatchIndividualResponse.model_validate_json(line, strict=True)
              for line in body.splitlines() if line.strip()]
    ids = [p.custom_id for p in parsed]
    assert len(ids) == len(set(ids)), "a custom_id twice in the results"
    return {p.custom_id: p.result for p in parsed}
