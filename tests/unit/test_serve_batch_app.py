"""``sparkbatch serve-batch``'s HTTP layer in-process (FastAPI's TestClient over ASGI, no socket):
the guard's Host / Origin / API key / body-size checks, the request models, OpenAI's error shape
on every refusal, and the OpenAPI document. The server itself, the ``openai`` client and the
Schemathesis run against a live server are tests/e2e/test_serve_batch*.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from sparkbatch_dagster.errors import ConfigError
from sparkbatch_dagster.serve.app import make_app
from sparkbatch_dagster.serve.guard import Access, Guard, access, host_name, origin_allowed
from sparkbatch_dagster.serve.worker import Store, Worker
from sparkbatch_dagster.spec import SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource

LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"messages": [{"role": "user", "content": "hi"}]}}).encode() + b"\n"
CREATE = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


def _client(root: Path, door: Access, host: str = "127.0.0.1:8400") -> tuple[TestClient, Store]:
    store = Store(root)
    # A worker that is never started: a created batch stays queued, nothing runs.
    worker = Worker(store, [], FakeVLLMResource(), SamplingSpec(max_tokens=8), 10, 0.79)
    return TestClient(make_app(store, worker, door), base_url=f"http://{host}"), store


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, Store]:
    return _client(tmp_path / "root", access("127.0.0.1", None, max_body=64 * 1024))


def _upload(client: TestClient, **headers: str) -> Any:
    return client.post("/v1/files", files={"file": ("r.jsonl", LINE)}, data={"purpose": "batch"}, headers=headers)


def _error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The OpenAI error of ``response``, checked for its status and shape."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert code is None or error["code"] == code, error
    return error  # type: ignore[no-any-return]


def test_the_openai_flow_in_process(served):
    client, store = served
    fid = _upload(client).json()["id"]
    assert client.get(f"/v1/files/{fid}/content").content == LINE
    ids = [client.post("/v1/batches", json={"input_file_id": fid, **CREATE}).json()["id"] for _ in range(3)]
    page = client.get("/v1/batches", params={"limit": 2}).json()
    assert [b["id"] for b in page["data"]] == [b.id for b in store.all_batches()][:2] and page["has_more"]
    rest = client.get("/v1/batches", params={"limit": 2, "after": page["last_id"]}).json()
    assert len(rest["data"]) == 1 and not rest["has_more"]
    assert {b["id"] for b in page["data"] + rest["data"]} == set(ids)
    assert client.get(f"/v1/batches/{ids[0]}").json()["status"] == "validating"


def test_bad_requests_are_400s_in_openais_shape_and_create_nothing(served):
    client, store = served
    fid = _upload(client).json()["id"]
    for limit in ("abc", "0", "101", ""):
        assert _error(client.get(f"/v1/batches?limit={limit}"), 400)["param"] == "limit"
    body = json.dumps({"input_file_id": fid, **CREATE})
    # A browser's simple POST (no preflight) is text/plain: never read as a batch.
    _error(client.post("/v1/batches", content=body, headers={"Content-Type": "text/plain"}), 400)
    _error(client.post("/v1/batches", content=b"{nope", headers={"Content-Type": "application/json"}), 400,
           "invalid_json")
    assert _error(client.post("/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/embeddings"}),
                  400)["param"] == "endpoint"
    assert "upload it" in _error(client.post("/v1/batches", json={"input_file_id": "file-x", **CREATE}), 400)["message"]
    for purpose in ("fine-tune", ""):
        assert _error(_upload_purpose(client, purpose), 400)["param"] == "purpose"
    assert _error(client.post("/v1/files", files={"file": ("r.jsonl", LINE)}), 400)["param"] == "purpose"
    assert store.all_batches() == []
    _error(client.get("/v1/batches/batch_nope"), 404, "not_found")
    _error(client.post("/v1/batches/batch_nope/cancel"), 404, "not_found")
    _error(client.get("/v1/files/file-nope/content"), 404, "not_found")
    _error(client.get("/v1/models"), 404, "not_found")
    refused = client.delete("/v1/batches")
    _error(refused, 405, "method_not_allowed")
    assert refused.headers["allow"] == "GET, POST"  # both routes on the path, as the fuzzer checks


def _upload_purpose(client: TestClient, purpose: str) -> Any:
    return client.post("/v1/files", files={"file": ("r.jsonl", LINE)}, data={"purpose": purpose})


def test_other_host_names_and_web_pages_are_refused(served, tmp_path):
    client, store = served
    fid = _upload(client).json()["id"]
    body = json.dumps({"input_file_id": fid, **CREATE})
    # DNS rebinding: the page's own name in Host; CSRF: its origin, with the simple content type.
    _error(client.post("/v1/batches", content=body, headers={"Host": "evil.example", "Content-Type": "text/plain"}),
           421, "host_not_allowed")
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "http://127.0.0.1.evil.example"}):
        _error(client.post("/v1/batches", json=json.loads(body), headers=headers), 403, "origin_not_allowed")
        _error(_upload(client, **headers), 403, "origin_not_allowed")
        _error(client.get("/v1/batches", headers=headers), 403)
    assert store.all_batches() == [] and len(list(store.files.glob("*.json"))) == 1
    for host in ("localhost:8400", "[::1]:1", "127.0.0.1", "LOCALHOST."):
        assert client.get("/v1/batches", headers={"Host": host}).status_code == 200, host
    assert client.get("/v1/batches", headers={"Origin": "http://localhost:3000"}).status_code == 200
    wide = access("10.1.2.3", "k", ["box.example.com"], ["https://notebook.example.com:8443/"])
    wide_client, _ = _client(tmp_path / "wide", wide, "10.1.2.3:8400")
    auth = {"Authorization": "Bearer k"}
    for host in ("10.1.2.3:8400", "box.example.com", "127.0.0.1:9"):
        assert wide_client.get("/v1/batches", headers={"Host": host, **auth}).status_code == 200, host
    assert wide_client.get("/v1/batches", headers={"Origin": "https://notebook.example.com:8443", **auth}).is_success
    _error(wide_client.get("/v1/batches", headers={"Origin": "https://notebook.example.com", **auth}), 403)


def test_allow_lists_from_the_command_line():
    assert host_name("[::1]:8400") == host_name("::1") == "[::1]" and host_name("Box.Example.:80") == "box.example"
    assert origin_allowed("http://[::1]:5173", frozenset()) and not origin_allowed("file://", frozenset())
    anywhere = access("0.0.0.0", "k")  # noqa: S104 - every address: clients use the machine's own
    assert "127.0.0.1" in anywhere.hosts and "0.0.0.0" not in anywhere.hosts  # noqa: S104
    with pytest.raises(ConfigError, match="--allow-origin 'notebook.example.com'"):
        access("127.0.0.1", None, allow_origins=["notebook.example.com"])
    with pytest.raises(ConfigError, match="--allow-host 'http://box/'"):
        access("127.0.0.1", None, allow_hosts=["http://box/"])
    with pytest.raises(ConfigError, match="--max-upload-mb"):
        access("127.0.0.1", None, max_body=0)


def test_the_api_key_is_checked_when_set(tmp_path):
    client, store = _client(tmp_path / "root", access("127.0.0.1", "s3cret"))
    for header in ({}, {"Authorization": "Bearer guess"}, {"Authorization": "Bearer s3cret "},
                   {"Authorization": "Bearer s3crét".encode()}):
        _error(client.get("/v1/batches", headers=header), 401, "invalid_api_key")
        _error(_upload(client, **header), 401)
    _error(client.get("/openapi.json"), 401)
    assert list(store.files.iterdir()) == []
    assert client.get("/v1/batches", headers={"Authorization": "Bearer s3cret"}).json()["data"] == []


def test_bodies_past_the_cap_are_refused_whatever_content_length_says(served):
    client, store = served

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length at all
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
        yield from [b"x" * 16 * 1024] * 8

    _error(client.post("/v1/files", content=chunks(), headers={"Content-Type": "multipart/form-data; boundary=b"}),
           413, "request_too_large")
    refused = client.post("/v1/files", files={"file": ("r.jsonl", b"x" * 65 * 1024)}, data={"purpose": "batch"})
    assert _error(refused, 413) and refused.headers["connection"] == "close"
    assert list(store.files.iterdir()) == []
    assert _upload(client).status_code == 200  # under the cap


async def _through_guard(max_body: int, headers: list[tuple[bytes, bytes]], chunks: int) -> tuple[int, int]:
    """(status, chunks the app was given) for a body of ``chunks`` 1 KiB chunks sent to a route
    that reads its whole body."""
    given = 0

    async def receive() -> dict[str, Any]:
        nonlocal given
        given += 1
        return {"type": "http.request", "body": b"x" * 1024, "more_body": given < chunks}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["more_body"]:
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/files", "headers": [(b"host", b"127.0.0.1"), *headers]}
    await Guard(app, Access(frozenset({"127.0.0.1"}), frozenset(), None, max_body))(scope, receive, send)
    return sent[0]["status"], given


@pytest.mark.parametrize("length", [b"-1", b"10", b"abc", None])
def test_the_cap_counts_the_bytes_received_not_the_header(length):
    import asyncio

    headers = [(b"content-length", length)] if length is not None else []
    # A 600 KiB body under a 16 KiB cap: refused after the 17th KiB, the rest never taken.
    assert asyncio.run(_through_guard(16 * 1024, headers, 600)) == (413, 17)
    assert asyncio.run(_through_guard(16 * 1024, headers, 16)) == (200, 16)
    declared = [(b"content-length", str(600 * 1024).encode())]
    assert asyncio.run(_through_guard(16 * 1024, declared, 600)) == (413, 0)  # refused before reading


def test_the_openapi_document_says_what_is_served(tmp_path):
    client, _ = _client(tmp_path / "root", access("127.0.0.1", "k"))
    doc = client.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
    operations = {f"{method.upper()} {path}": op for path, item in doc["paths"].items() for method, op in item.items()}
    # Every route the app serves is in the document, and only those: one router per API, each whole.
    assert set(operations) == {f"{m} {r.path}" for r in client.app.routes if isinstance(r, APIRoute) for m in r.methods}
    by_api = {prefix: {name for name in operations if name.split(" ")[1].startswith(prefix)}
              for prefix in ("/v1/files", "/v1/batches", "/v1/messages/batches", "/healthz")}
    assert sum(map(len, by_api.values())) == len(operations) and all(by_api.values())
    assert {"POST", "GET", "DELETE"} <= {name.split(" ")[0] for name in by_api["/v1/files"]}
    for name, op in operations.items():
        assert "422" not in op["responses"] and {"400", "401", "403", "413", "421"} <= set(op["responses"])
        shape = "AnthropicErrorResponse" if "/v1/messages/" in name else "ErrorResponse"  # each API's errors
        assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith("/" + shape), name
    limit = next(p for p in operations["GET /v1/batches"]["parameters"] if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 100)
    assert doc["security"] == [{"apiKey": []}] and doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert client.get("/docs", headers={"Authorization": "Bearer k"}).status_code == 404  # no CDN scripts


def test_healthz_answers_while_the_server_serves_behind_the_same_guard(tmp_path):
    """Liveness touches neither the store nor the worker: it answers with the store's folder gone."""
    client, store = _client(tmp_path / "root", access("127.0.0.1", "k"))
    import shutil

    shutil.rmtree(store.root)
    answer = client.get("/healthz", headers={"Authorization": "Bearer k"})
    assert (answer.status_code, answer.json()) == (200, {"status": "ok"})
    assert client.get("/healthz").status_code == 401  # the key, as every route
    assert client.get("/healthz", headers={"Authorization": "Bearer k", "Host": "evil.example"}).status_code == 421
    assert client.post("/healthz", headers={"Authorization": "Bearer k"}).status_code == 405


def test_the_message_batches_routes_refuse_in_anthropics_shape(tmp_path):
    """The guard's refusals and the framework's, under /v1/messages, are Anthropic's error; the
    same refusal on an OpenAI route stays OpenAI's. Anthropic's ``x-api-key`` carries the key."""
    client, store = _client(tmp_path / "root", access("127.0.0.1", "k"))

    def anthropic_error(response: Any, status: int, kind: str) -> None:
        assert response.status_code == status, response.text
        body = response.json()
        assert set(body) == {"type", "error", "request_id"} and body["type"] == "error", body
        assert body["error"]["type"] == kind and body["error"]["message"] and body["request_id"].startswith("req_")

    path, key = "/v1/messages/batches", {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    anthropic_error(client.get(path), 401, "authentication_error")
    anthropic_error(client.get(path, headers={"x-api-key": "guess"}), 401, "authentication_error")
    anthropic_error(client.get(path, headers={**key, "Host": "evil.example"}), 421, "invalid_request_error")
    anthropic_error(client.get(path, headers={**key, "Origin": "http://evil.example"}), 403, "permission_error")
    anthropic_error(client.get(f"{path}/msgbatch_nope", headers=key), 404, "not_found_error")
    anthropic_error(client.get(path, params={"limit": 0}, headers=key), 400, "invalid_request_error")
    anthropic_error(client.put(path, headers=key), 405, "invalid_request_error")
    anthropic_error(client.post(path, content=b"{oops", headers={**key, "Content-Type": "application/json"}), 400,
                    "invalid_request_error")
    assert client.get(path, headers=key).json() == {"data": [], "has_more": False, "first_id": None, "last_id": None}
    assert client.get(path, headers={"Authorization": "Bearer k"}).status_code == 200
    _error(client.get("/v1/batches"), 401, "invalid_api_key")  # OpenAI's route: OpenAI's shape
    _error(client.get("/v1/batches/batch_nope", headers={"Authorization": "Bearer k"}), 404, "not_found")
    assert store.all_batches() == []
