"""OpenAI conformance of ``sparkbatch serve-batch``: the unchanged ``openai`` client walks batches
through every documented status (validating -> in_progress -> finalizing -> completed; validating
-> failed; in_progress -> cancelling -> cancelled; expired) and files through create, list
(purpose, limit, after, order), retrieve, content and delete.

Every object the server returns is checked on its raw HTTP JSON (an httpx response hook under the
client): parsed in strict mode with the ``openai`` package's own types (``Batch``, ``FileObject``,
``FileDeleted``, ``BatchError``, ``ErrorObject``; each result line as OpenAI's per-line object, its
body as ``ChatCompletion``), and each Batch and File field against the field tables of
docs/batch-files.md ("The Batch and File objects, field by field"): a field added or dropped on
either side, a type, or a field set (or null) in a status the table does not say fails here.

The server runs in this process (its routes, store and worker as ``serve-batch`` builds them, on
loopback) so that the test can hold the worker at ``finalizing`` (a store listener) and move the
expiry clock (``Worker.expire_due(at=...)``); each batch still runs in a ``run-batch`` child on a
fake engine whose gate holds the run mid-batch. No sleep decides anything.
"""

from __future__ import annotations

import json
import re
import runpy
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict

from sparkbatch_dagster.serve.app import make_app
from sparkbatch_dagster.serve.guard import access
from sparkbatch_dagster.serve.record import BatchRecord
from sparkbatch_dagster.serve.worker import Store, Worker
from sparkbatch_dagster.spec import SamplingSpec
from testkit import wait_until

openai = pytest.importorskip("openai")
DOC = Path(__file__).resolve().parents[2] / "docs" / "batch-files.md"
URL = "/v1/chat/completions"
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled")
ENDED = ("failed", "completed", "expired", "cancelled")
TYPES: dict[str, type] = {"string": str, "integer": int, "object": dict, "boolean": bool}
N = 30  # good requests; shards of 10, the engine's gate after 15 answers


@dataclass(frozen=True)
class Row:
    """One field of a table: its JSON type, the statuses it is set in, those it may be set in."""

    kind: type
    always: frozenset[str]
    maybe: frozenset[str]


def field_table(title: str) -> dict[str, Row]:
    """The table of docs/batch-files.md whose header starts ``| <title> |``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {title} |"))
    table: dict[str, Row] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        name, kind, _, where = (cell.strip() for cell in line.strip("|").split("|"))
        always, maybe = set(), set()
        for status, star in re.findall(r"`?(all|none|[a-z_]+)`?(\*?)", where.split("(")[0]):
            statuses = STATUSES if status == "all" else () if status == "none" else (status,)
            assert set(statuses) <= set(STATUSES), f"{title} {name}: {status!r} is no status"
            (maybe if star else always).update(statuses)
        table[name.strip("`")] = Row(TYPES[kind], frozenset(always), frozenset(maybe))
    return table


def test_the_field_tables_are_openais_objects():
    """The doc's tables list exactly the fields of the ``openai`` package's Batch and FileObject
    (besides the rows marked as this server's own)."""
    from openai.types import Batch, FileObject

    ours = {line.split("|")[1].strip(" `") for line in DOC.read_text().splitlines() if "this server's, not" in line}
    assert ours == {"reused_requests"}
    assert set(field_table("Batch field")) - ours == set(Batch.model_fields)
    assert set(field_table("File field")) == set(FileObject.model_fields)


class LineResponse(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    status_code: int
    request_id: str
    body: dict[str, Any]


class LineError(BaseModel):
    """A line's ``error``, for a request that got no HTTP answer (expired, cancelled): OpenAI's
    ``BatchRequestOutputError``, its code and message and nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid")
    code: str
    message: str


class OutputLine(BaseModel):
    """OpenAI's per-line object of a batch's output and error files (``BatchRequestOutput``)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    id: str
    custom_id: str
    response: LineResponse | None
    error: LineError | None


class Conformance:
    """Checks every response the client gets (an httpx response hook): the objects in strict mode
    with the ``openai`` types, every Batch and File against the doc's tables."""

    def __init__(self) -> None:
        self.batches, self.files = field_table("Batch field"), field_table("File field")
        self.seen: dict[str, list[str]] = {}  # batch id -> the statuses its answers carried, in order
        self.checked = 0

    def __call__(self, response: httpx.Response) -> None:
        response.read()
        method, path = response.request.method, response.request.url.path
        if path.endswith("/content") and response.status_code == 200:
            return  # a file's bytes: the test checks the result lines it downloads
        body = response.json()
        if response.status_code >= 400:
            from openai.types.shared import ErrorObject

            assert set(body) == {"error"}, body
            ErrorObject.model_validate(body["error"], strict=True)
        elif path == "/v1/files" and method == "GET":
            self._page(body, self.file)
        elif path == "/v1/batches" and method == "GET":
            self._page(body, self.batch)
        elif path.startswith("/v1/files") and method == "DELETE":
            from openai.types import FileDeleted

            assert set(body) == {"id", "object", "deleted"}, body
            FileDeleted.model_validate(body, strict=True)
        elif path.startswith("/v1/files"):
            self.file(body)
        else:
            self.batch(body)
        self.checked += 1

    def _page(self, body: dict[str, Any], check: Any) -> None:
        assert set(body) == {"object", "data", "first_id", "last_id", "has_more"} and body["object"] == "list"
        for item in body["data"]:
            check(item)
        ids = [item["id"] for item in body["data"]]
        assert (body["first_id"], body["last_id"]) == ((ids[0], ids[-1]) if ids else (None, None))

    def batch(self, d: dict[str, Any]) -> None:
        from openai.types import Batch, BatchError

        Batch.model_validate(d, strict=True)
        self._fields(d, self.batches, d["status"])
        for error in (d["errors"] or {}).get("data", []):
            BatchError.model_validate(error, strict=True)
        seen = self.seen.setdefault(d["id"], [])
        if not seen or seen[-1] != d["status"]:
            seen.append(d["status"])

    def file(self, d: dict[str, Any]) -> None:
        from openai.types import FileObject

        FileObject.model_validate(d, strict=True)
        self._fields(d, self.files, "completed")  # a file has no status of the batch kind: "all" rows

    def _fields(self, d: dict[str, Any], table: dict[str, Row], status: str) -> None:
        assert set(d) == set(table), f"fields in the object or the table, not both: {set(d) ^ set(table)}"
        for name, row in table.items():
            value = d[name]
            if value is not None:
                assert isinstance(value, row.kind) and isinstance(value, bool) == (row.kind is bool), (name, value)
            if status in row.always:
                assert value is not None, f"{name} is null on a {status} object: {d}"
            elif status not in row.maybe:
                assert value is None, f"{name} is set on a {status} object, which the table does not say: {d}"


class Box:
    """``serve-batch``'s app, store and worker in this process, on a loopback port, and an
    ``openai`` client whose every answer :class:`Conformance` checks."""

    def __init__(self, tmp: Path, engine: str) -> None:
        import uvicorn

        (tmp / "engine.py").write_text("from sparkbatch_dagster.testing import FakeVLLMResource\n"
                                       f"resource = {engine}\n")
        resource = runpy.run_path(str(tmp / "engine.py"))["resource"]
        self.store = Store(tmp / "root")
        self.worker = Worker(self.store, ["--engine-file", str(tmp / "engine.py")], resource,
                             SamplingSpec(max_tokens=8), 10, 0.79)
        self.moves: dict[str, list[str]] = {}  # batch id -> each status it moved to, as the store wrote it
        # With hold_finalizing, the worker waits at `finalizing` (held set) until release is set.
        self.hold_finalizing, self.held, self.release = False, threading.Event(), threading.Event()
        self.store.listeners.append(self._moved)
        sock = socket.create_server(("127.0.0.1", 0))
        app = make_app(self.store, self.worker, access("127.0.0.1", None))
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning"))
        self.worker.start()
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until("the server to start", lambda: self.server.started)
        self.check = Conformance()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}/v1", api_key="none",
                                    max_retries=0, http_client=httpx.Client(event_hooks={"response": [self.check]}))

    def _moved(self, batch: BatchRecord) -> None:
        self.moves.setdefault(batch.id, []).append(batch.status)
        if batch.status == "finalizing" and self.hold_finalizing:
            self.held.set()
            assert self.release.wait(120)  # until the test has seen it; the deadline only bounds a hang

    def wait(self, bid: str, *states: str, least: int = 0) -> Any:
        """The batch once its status is one of ``states`` with at least ``least`` answers."""
        def reached() -> Any:
            b = self.client.batches.retrieve(bid)
            return b if b.status in states and b.request_counts.completed >= least else None

        return wait_until(f"batch {bid} to be {states} with {least}+ answers", reached, deadline_s=300)

    def results(self, batch: Any, ids: list[str]) -> tuple[list[OutputLine], list[OutputLine]]:
        """The batch's output and error lines, each checked, each of ``ids`` once across the two."""
        from openai.types.chat import ChatCompletion
        from openai.types.shared import ErrorObject

        def lines(fid: str | None) -> list[OutputLine]:
            if fid is None:
                return []
            return [OutputLine.model_validate(json.loads(x), strict=True)
                    for x in self.client.files.content(fid).text.splitlines()]

        out, err = lines(batch.output_file_id), lines(batch.error_file_id)
        for line in out:
            assert line.error is None and line.response is not None and line.response.status_code == 200
            ChatCompletion.model_validate(line.response.body, strict=True)
        for line in err:
            # An HTTP answer (the request's own failure) or none (never run), never both, as OpenAI's.
            assert (line.error is None) != (line.response is None)
            if line.response is not None:
                assert line.response.status_code >= 400
                ErrorObject.model_validate(line.response.body["error"], strict=True)
        got = [line.custom_id for line in out + err]
        assert sorted(got) == sorted(ids), "each of the user's custom_ids exactly once, and no other id"
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (len(ids), len(out), len(err))
        return out, err

    def usage_matches(self, batch: Any, out: list[OutputLine]) -> None:
        """``usage`` and ``model`` of an ended batch: the sums and the model of its answers."""
        bodies = [line.response.body for line in out if line.response is not None]
        assert batch.usage is not None and batch.model == bodies[0]["model"]
        assert batch.usage.input_tokens == sum(b["usage"]["prompt_tokens"] for b in bodies)
        assert batch.usage.output_tokens == sum(b["usage"]["completion_tokens"] for b in bodies) > 0
        assert batch.usage.total_tokens == batch.usage.input_tokens + batch.usage.output_tokens

    def stop(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture
def boxes() -> Iterator[list[Box]]:
    started: list[Box] = []
    yield started
    for box in started:
        box.stop()


def _line(cid: str, **body: Any) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": URL,
                       "body": {"model": "gpt-x", "messages": [{"role": "user", "content": f"Question {cid}?"}],
                                "max_tokens": 8, **body}})


def _requests(path: Path) -> list[str]:
    """N good requests and one its own error line (a temperature out of range): every id."""
    ids = [f"req-{i}" for i in range(N)] + ["hot"]
    path.write_text("\n".join([*(_line(i) for i in ids[:N]), _line("hot", temperature=9)]) + "\n")
    return ids


def _create(box: Box, path: Path, **extra: Any) -> Any:
    upload = box.client.files.create(file=path.open("rb"), purpose="batch")
    batch = box.client.batches.create(input_file_id=upload.id, endpoint=URL, completion_window="24h", **extra)
    assert batch.status == "validating" and batch.in_progress_at is None
    return batch


def test_validating_in_progress_finalizing_completed_and_the_files(tmp_path, boxes):
    gate = tmp_path / "gate"
    ids = _requests(tmp_path / "requests.jsonl")
    boxes.append(box := Box(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    client = box.client
    batch = _create(box, tmp_path / "requests.jsonl", metadata={"team": "labels"})
    assert batch.request_counts.total == N + 1 and batch.metadata == {"team": "labels"}
    running = box.wait(batch.id, "in_progress", least=10)  # a shard committed, the engine held at its gate
    assert running.in_progress_at >= running.created_at and running.usage is None
    box.hold_finalizing = True
    gate.touch()
    # No poll while the rest runs: what the client sees at `finalizing` is what the worker wrote
    # on its way there, not a progress count that a poll happened to refresh.
    assert box.held.wait(300)  # the worker is held at `finalizing` until the test lets it go
    finalizing = client.batches.retrieve(batch.id)
    assert finalizing.status == "finalizing" and finalizing.finalizing_at >= finalizing.in_progress_at
    counts = finalizing.request_counts  # the run is over: the counts are final already
    assert (counts.total, counts.completed, counts.failed) == (N + 1, N, 1)
    box.release.set()
    done = box.wait(batch.id, "completed")
    assert done.completed_at >= done.finalizing_at and done.errors is None
    out, err = box.results(done, ids)
    assert [line.custom_id for line in err] == ["hot"] and err[0].response.status_code == 400  # type: ignore[union-attr]
    box.usage_matches(done, out)
    assert box.moves[batch.id] == ["in_progress", "finalizing", "completed"]
    assert box.check.seen[batch.id] == ["validating", "in_progress", "finalizing", "completed"]

    # Files: create, list (purpose, limit, after, order), retrieve, content, delete.
    other = client.files.create(file=("second.jsonl", b"{}\n"), purpose="batch")
    uploads = [done.input_file_id, other.id]
    results = [done.output_file_id, done.error_file_id]
    newest_first = [f.id for f in client.files.list()]
    assert set(newest_first) == {*uploads, *results} and newest_first.index(other.id) == 0
    assert [f.id for f in client.files.list(order="asc")] == newest_first[::-1]
    assert [f.id for f in client.files.list(purpose="batch")] == [other.id, done.input_file_id]
    assert {f.id for f in client.files.list(purpose="batch_output")} == set(results)
    page = client.files.list(limit=1, order="asc")
    assert [f.id for f in page.data] == [newest_first[-1]] and page.has_more
    walked = [f.id for f in page]  # the client follows `after` from page to page
    assert walked == newest_first[::-1]
    assert client.files.list(after=newest_first[-1], order="asc", limit=2).data[0].id == newest_first[-2]
    assert client.files.list(after=newest_first[-1]).data == [] and client.files.list(after="file-none").data == []
    source = (tmp_path / "requests.jsonl").read_bytes()
    assert client.files.content(done.input_file_id).content == source
    upload = client.files.retrieve(done.input_file_id)
    assert (upload.bytes, upload.filename, upload.purpose, upload.status) == (len(source), "requests.jsonl", "batch",
                                                                              "processed")
    for fid in results:
        assert client.files.retrieve(fid).bytes == len(client.files.content(fid).content)
    assert client.batches.list(limit=1).data[0].id == batch.id
    refusals = {"purpose 'batch_output'": {"input_file_id": done.output_file_id},  # a result file is no input
                "metadata.n": {"metadata": {"n": 1}},  # OpenAI's metadata: strings only
                "metadata": {"metadata": {f"k{i}": "v" for i in range(17)}},  # at most 16 pairs
                "metadata.v": {"metadata": {"v": "x" * 513}}}
    for match, body in refusals.items():
        with pytest.raises(openai.BadRequestError, match=match):
            client.batches.create(**{"input_file_id": other.id, "endpoint": URL, "completion_window": "24h", **body})
    assert [b.id for b in client.batches.list()] == [batch.id]  # none of them was created
    for fid in newest_first:
        deleted = client.files.delete(fid)
        assert (deleted.id, deleted.deleted, deleted.object) == (fid, True, "file")
    assert client.files.list().data == []
    for gone in (client.files.retrieve, client.files.delete, client.files.content):
        with pytest.raises(openai.NotFoundError):
            gone(done.input_file_id)
    assert box.check.checked > 20


def test_validating_to_failed_with_line_numbered_errors(tmp_path, boxes):
    bad = [_line("a"), "{not json", _line("a"), json.dumps({"method": "POST", "url": URL, "body": {}}),
           json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}), "",
           "[1, 2]"]
    (tmp_path / "bad.jsonl").write_text("\n".join(bad) + "\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    boxes.append(box := Box(tmp_path, "FakeVLLMResource()"))
    failed = box.wait(_create(box, tmp_path / "bad.jsonl").id, "failed")
    assert failed.errors is not None and failed.errors.object == "list" and failed.failed_at >= failed.created_at
    assert [(e.line, e.code, e.param) for e in failed.errors.data] == [
        (2, "invalid_json_line", None), (3, "duplicate_custom_id", "custom_id"),
        (4, "missing_required_parameter", "custom_id"), (5, "url_mismatch", "url"), (7, "invalid_json_line", None)]
    assert all(e.message for e in failed.errors.data)
    counts = failed.request_counts
    assert (counts.total, counts.completed, counts.failed) == (0, 0, 0)  # OpenAI counts no request of a file it refused
    assert failed.usage is not None and failed.usage.total_tokens == 0 and failed.model is None
    empty = box.wait(_create(box, tmp_path / "empty.jsonl").id, "failed")
    assert [e.code for e in empty.errors.data] == ["empty_file"]  # type: ignore[union-attr]
    for b in (failed, empty):
        assert box.moves[b.id] == ["failed"] and box.check.seen[b.id] == ["validating", "failed"]
    assert box.client.files.delete(failed.input_file_id).deleted  # an ended batch's file may go


def test_in_progress_cancelling_cancelled(tmp_path, boxes):
    gate = tmp_path / "gate"
    ids = _requests(tmp_path / "requests.jsonl")
    boxes.append(box := Box(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    batch = _create(box, tmp_path / "requests.jsonl")
    box.wait(batch.id, "in_progress", least=10)
    with pytest.raises(openai.BadRequestError, match="cancel it"):  # its input is in use
        box.client.files.delete(batch.input_file_id)
    cancelling = box.client.batches.cancel(batch.id)  # the run is held at the gate: it stops as on Ctrl-C
    assert cancelling.status == "cancelling" and cancelling.cancelling_at >= cancelling.in_progress_at
    cancelled = box.wait(batch.id, "cancelled")
    assert cancelled.cancelled_at >= cancelled.cancelling_at and cancelled.completed_at is None
    out, err = box.results(cancelled, ids)
    assert 10 <= len(out) < N and {"batch_cancelled"} <= {line.error.code for line in err if line.error}
    unrun = [line for line in err if line.error and line.error.code == "batch_cancelled"]
    assert unrun and all(line.response is None for line in unrun)  # OpenAI's shape of a request never run
    box.usage_matches(cancelled, out)
    assert box.client.batches.cancel(batch.id).status == "cancelled"  # again: nothing changes
    assert box.moves[batch.id] == ["in_progress", "cancelling", "cancelled"]
    assert box.check.seen[batch.id][:2] == ["validating", "in_progress"]
    assert box.check.seen[batch.id][-2:] == ["cancelling", "cancelled"]


def test_expired_when_the_completion_window_passes(tmp_path, boxes):
    gate = tmp_path / "gate"
    ids = _requests(tmp_path / "requests.jsonl")
    boxes.append(box := Box(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    running = _create(box, tmp_path / "requests.jsonl")
    box.wait(running.id, "in_progress", least=10)
    queued = box.wait(_create(box, tmp_path / "requests.jsonl").id, "in_progress")  # validated, waiting its turn
    assert box.worker.expire_due(at=running.expires_at - 1) == []  # the clock is the service's, injected
    assert set(box.worker.expire_due(at=queued.expires_at)) == {running.id, queued.id}
    for bid in (running.id, queued.id):
        expired = box.wait(bid, "expired")
        assert expired.expired_at and expired.cancelled_at is None and expired.cancelling_at is None
        out, err = box.results(expired, ids)
        late = [line for line in err if line.error and line.error.code == "batch_expired"]
        assert late and all(line.response is None for line in late)
        assert late[0].error.message == ("This request could not be executed before the completion "  # type: ignore
                                         "window expired.")
        assert box.moves[bid] == ["in_progress", "expired"]
        assert box.check.seen[bid][0] == "validating" and box.check.seen[bid][-1] == "expired"
    first = box.client.batches.retrieve(running.id)
    box.usage_matches(first, box.results(first, ids)[0])
    never = box.client.batches.retrieve(queued.id)
    assert never.request_counts.completed == 0 and never.output_file_id is None and never.model is None
    assert never.usage is not None and never.usage.total_tokens == 0 and never.model_extra["reused_requests"] == 0
