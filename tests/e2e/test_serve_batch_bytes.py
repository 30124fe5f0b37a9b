"""``sparkbatch serve-batch`` and a batch file with a stray byte (issue 49): a raw NUL inside one
request line, in the first 64 KiB (the part a reader sniffs) or later, is that request's error
line; every other request is answered. Before, a NUL in the first 64 KiB refused the whole file
and the batch failed with none of its requests answered.

The server is started and driven as tests/e2e/test_serve_batch.py does (its ``Server`` and
``servers`` fixture), and spoken to only through the ``openai`` client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e.test_serve_batch import Server, _results, servers  # noqa: F401 - servers: the fixture

pytest.importorskip("openai")


def _request(i: int, nul: bool) -> bytes:
    content = b"Question %d?%s" % (i, b"\x00 tail" if nul else b"")
    return (b'{"custom_id": "req-%d", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "any", '
            b'"messages": [{"role": "user", "content": "%s"}], "max_tokens": 8}}' % (i, content))


@pytest.mark.parametrize(("n", "bad"), [(6, 2), (800, 700)], ids=["first-64k", "later"])
def test_a_nul_in_one_request_line_fails_that_request_only(tmp_path: Path, servers, n: int, bad: int) -> None:  # noqa: F811
    data = b"\n".join(_request(i, i == bad) for i in range(1, n + 1)) + b"\n"
    (tmp_path / "requests.jsonl").write_bytes(data)
    assert (data.index(b"\x00") < 65536) == (bad < 10)
    servers.append(server := Server(tmp_path, "FakeVLLMResource()"))
    client = server.client
    uploaded = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = server.batch(batch.id, "completed", "failed")
    assert done.status == "completed", done.errors
    out, err = _results(client, done)
    assert sorted(line["custom_id"] for line in out) == sorted(f"req-{i}" for i in range(1, n + 1) if i != bad)
    assert done.request_counts.completed == n - 1 and done.request_counts.failed == 1
    [line] = err
    assert line["custom_id"] == f"unparsable-line-{bad}" and line["response"]["status_code"] == 400
    message = line["response"]["body"]["error"]["message"]
    assert f"line {bad}" in message and "0x00" in message, json.dumps(line)
