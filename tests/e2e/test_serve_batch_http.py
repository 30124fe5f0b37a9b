"""``sparkbatch serve-batch``'s HTTP layer on a live server (uvicorn on loopback, in its own
process, the fake engine): each break of the bug report, reproduced with raw requests, and
Schemathesis fuzzing every operation of the server's own OpenAPI document.

The report: a web page could create batches (no Host or Origin check: DNS rebinding and CSRF),
``Content-Length: -1`` read a body whole into memory past the cap, ``?limit=abc`` dropped the
connection, and a listen backlog of 5 reset concurrent uploads. The ``openai`` client's own
flow (upload, create, poll, list, cancel, download) is tests/e2e/test_serve_batch.py.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from e2e.test_serve_batch import Server

openai = pytest.importorskip("openai")
LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"messages": [{"role": "user", "content": "hi"}]}}).encode() + b"\n"
KEY = "fuzz-key"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server as a user starts it on loopback: no key, no options."""
    server = Server(tmp_path_factory.mktemp("door"), "FakeVLLMResource()")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with an API key and a 1 MiB body cap."""
    server = Server(tmp_path_factory.mktemp("keyed"), "FakeVLLMResource()", api_key=KEY,
                    options=["--max-upload-mb", "1"])
    yield server
    server.stop()


def _request(server: Server, method: str, path: str, body: bytes | str = b"",
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one raw request; ``headers`` may name their own Host."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        data = answer.read()
        return answer.status, json.loads(data) if data.startswith(b"{") else data
    finally:
        conn.close()


def _stored(server: Server) -> tuple[int, int]:
    """(files, batches) in the server's folder."""
    root = server.tmp / "root"
    return len(list((root / "files").glob("*.json"))), len(list((root / "batches").glob("batch_*.json")))


def test_a_web_page_creates_nothing(door):
    """DNS rebinding (the page's own name in Host) and CSRF (its Origin), as a browser's simple
    requests (text/plain, a form's multipart): refused before any route runs."""
    fid = door.client.files.create(file=("r.jsonl", LINE), purpose="batch").id
    before = _stored(door)
    body = json.dumps({"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    page = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    status, answer = _request(door, "POST", "/v1/batches", body, {**page, "Host": f"evil.example:{door.port}"})
    assert status == 421 and answer["error"]["code"] == "host_not_allowed"
    status, answer = _request(door, "POST", "/v1/batches", body, page)
    assert status == 403 and answer["error"]["code"] == "origin_not_allowed"
    form = b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n' + LINE + b"\r\n--b--\r\n"
    status, _ = _request(door, "POST", "/v1/files", form,
                         {"Origin": "http://evil.example", "Content-Type": "multipart/form-data; boundary=b"})
    assert status == 403
    assert _stored(door) == before and door.client.batches.list().data == []


def test_a_bad_query_parameter_is_a_400(door):
    for query in ("limit=abc", "limit=0", "limit=101"):
        status, answer = _request(door, "GET", f"/v1/batches?{query}")
        assert status == 400 and answer["error"]["param"] == "limit", (query, answer)
        assert answer["error"]["type"] == "invalid_request_error" and "limit" in answer["error"]["message"]


def _peak_rss(pid: int) -> int:
    """The process's peak resident memory since the last :func:`_reset_peak`, in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) restarts from the resident size now


def test_content_length_minus_one_reads_nothing_into_memory(door):
    """The old server read a ``Content-Length: -1`` body to its end, whole, past the cap."""
    offered = 192 * MiB
    before = _stored(door)
    _reset_peak(door.proc.pid)
    baseline = _peak_rss(door.proc.pid)
    head = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{door.port}\r\nContent-Length: -1\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n\r\n").encode()
    answer = b""
    with socket.create_connection(("127.0.0.1", door.port), timeout=120) as sock:
        try:
            sock.sendall(head)
            for _ in range(offered // MiB):
                sock.sendall(b"x" * MiB)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: what is asked
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass  # closed with the rest of the body unread
    grown = _peak_rss(door.proc.pid) - baseline
    assert grown < offered // 4, f"the server's peak memory grew by {grown / MiB:.0f} MiB for a refused body"
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 413")), answer[:200]
    assert _stored(door) == before


def test_fifty_clients_uploading_at_once_all_get_in(door):
    """The old server's listen backlog of 5 reset some of 50 concurrent connections."""
    n = 50
    ready = threading.Barrier(n)

    def upload(i: int) -> str:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{door.port}/v1", api_key="none", max_retries=0)
        with client:
            ready.wait()  # every client connects at the same moment
            return client.files.create(file=(f"r{i}.jsonl", LINE * 100), purpose="batch").id

    with ThreadPoolExecutor(n) as pool:
        ids = list(pool.map(upload, range(n)))
    assert len(set(ids)) == n
    assert all(door.client.files.retrieve(fid).bytes == len(LINE) * 100 for fid in ids[:5])


def test_bodies_past_the_cap_are_refused(keyed):
    """A chunked body (no Content-Length) just over the 1 MiB cap, and a declared one."""
    before = _stored(keyed)
    auth = f"Authorization: Bearer {KEY}\r\nHost: 127.0.0.1:{keyed.port}\r\n"
    chunk = b"x" * (64 * 1024)
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
    chunks = [part] + [chunk] * 17  # a file of 1 MiB + 64 KiB, its form never ended
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    chunked = (f"POST /v1/files HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n"
               "Content-Type: multipart/form-data; boundary=b\r\n\r\n").encode() + body
    declared = f"POST /v1/files HTTP/1.1\r\n{auth}Content-Length: {2 * MiB}\r\n\r\n".encode()  # and no body sent
    for request in (chunked, declared):
        status, answer = _raw(keyed.port, request)
        assert status == 413 and answer["error"]["code"] == "request_too_large", answer
    assert _stored(keyed) == before
    small = keyed.client.files.create(file=("r.jsonl", LINE * 1000), purpose="batch")  # under the cap
    assert small.bytes == len(LINE) * 1000


def _raw(port: int, request: bytes) -> tuple[int, Any]:
    """(status, JSON body) of one request written as bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(request)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, json.loads(answer.read())


SCHEMATHESIS_CONFIG = """
# Every check (set here, not with --checks: the command line would override the operations' own).
checks.enabled = true

# A well-formed input_file_id that names no uploaded file is a 400, as OpenAI answers (the openai
# client's BadRequestError; tests/e2e/test_serve_batch.py): not a schema-valid request refused.
[[operations]]
include-operation-id = "batches_create"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404"]

# Message Batches: a create whose custom_ids repeat is a 400 (Anthropic's: unique in the batch,
# which JSON Schema cannot say of one field of the items), and deleting a batch that has not
# ended is a 400 (Anthropic's: cancel it first), as is asking for its results before it has ended,
# whatever the request's shape.
[[operations]]
include-operation-id = "message_batches_create"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404"]

[[operations]]
include-operation-id = "message_batches_delete"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404"]

[[operations]]
include-operation-id = "message_batches_results"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404"]

# A multipart file part is bytes: a "file" Schemathesis generated from an integer (-1514306) is a
# file of those digits, not a schema violation (its false positives on format: binary parts,
# schemathesis/schemathesis#3801, #3862). The bad purposes and missing parts it would catch are
# tests/unit/test_serve_batch_app.py's.
[[operations]]
include-operation-id = "files_create"
checks.negative_data_rejection.enabled = false
"""


def test_schemathesis_finds_nothing_against_the_openapi_document(keyed, tmp_path):
    """Every operation of /openapi.json, every check (server errors, status codes, response
    schemas, negative data refused, the Allow header, the key enforced, ...), in every phase:
    coverage, fuzzing, and stateful runs that follow the document's links from an upload to a
    batch, its retrieval and its cancel. Seeded: the same cases each run."""
    config, report = tmp_path / "schemathesis.toml", tmp_path / "schemathesis.json"
    config.write_text(SCHEMATHESIS_CONFIG)
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
           f"http://127.0.0.1:{keyed.port}/openapi.json", "-H", f"Authorization: Bearer {KEY}",
           "--max-examples", "40", "--seed", "49", "--request-timeout", "60", "--report", "json",
           "--report-json-path", str(report), "--no-color"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    result = json.loads(report.read_text())
    counts = {"operations": result["operations"]["tested"], "generated": result["test_cases"]["generated"],
              "failures": len(result["failures"]), "errors": len(result["errors"])}
    print(f"schemathesis: {counts}")  # pytest -s shows it
    conn = http.client.HTTPConnection("127.0.0.1", keyed.port, timeout=120)
    conn.request("GET", "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    doc = json.loads(conn.getresponse().read())
    assert counts["operations"] == sum(map(len, doc["paths"].values()))  # every operation the document lists
    assert counts["generated"] > 100 and not counts["failures"] and not counts["errors"]
    assert all(phase["status"] == "success" for phase in result["phases"].values() if phase["status"] != "skip")


def test_sigterm_stops_the_server(keyed):
    """``docker stop``: the server (and any batch child the fuzzing left running) ends, exit code 0."""
    keyed.proc.send_signal(signal.SIGTERM)
    assert keyed.proc.wait(120) == 0
