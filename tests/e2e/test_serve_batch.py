"""``sparkbatch serve-batch`` against the real ``openai`` client on loopback: a batch created,
polled, downloaded; one cancelled halfway (its finished rows kept); a server killed mid-batch and
started again (the batch finishes, every custom_id once, finished rows not asked again).

The server runs as a user starts it, in its own process; its batches run in ``run-batch``
children on a fake engine whose gate holds the run mid-batch until the test opens it (no sleeps
decide anything: each wait is for a state the server reports, under a generous deadline).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from sparkbatch_dagster import ConfigError
from sparkbatch_dagster.cli.serve_batch import check_bind
from sparkbatch_dagster.engines.server.server_process import free_port
from testkit import wait_until

openai = pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[2]
N = 40  # requests; shards of 10


def _requests(path: Path, n: int = N) -> list[str]:
    ids = [f"req-{i}" for i in range(n)]
    lines = [json.dumps({"custom_id": rid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "any", "messages": [{"role": "user", "content": f"Question {rid}?"}],
                                  "max_tokens": 8}}) for rid in ids]
    # Two requests OpenAI answers with an error line of their own (a file-level fault, such as a
    # line that is not JSON, fails the whole batch instead: tests/e2e/test_batch_semantics.py).
    lines += [json.dumps({"custom_id": f"bad-{k}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"messages": [{"role": "user", "content": "x"}], **extra}})
              for k, extra in enumerate([{"temperature": 9}, {"stop": ["1", "2", "3", "4", "5"]}])]
    path.write_text("\n".join(lines) + "\n")
    return ids


class Server:
    """``sparkbatch serve-batch`` in its own process, and an ``openai`` client pointed at it."""

    def __init__(self, tmp: Path, engine: str, api_key: str | None = None, options: Sequence[str] = ()) -> None:
        self.tmp, self.port = tmp, free_port()
        source = ("from sparkbatch_dagster import VLLMResource\n"
                  f"from sparkbatch_dagster.testing import FakeVLLMResource\nresource = {engine}\n")
        (tmp / "engine.py").write_text(source)
        args = ["--api-key", api_key] if api_key else []
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp / "dagster_home")}
        self.log = (tmp / "server.log").open("ab")
        # Started with SIGINT ignored, as a script's background job is (CI runs the suite so): the
        # server still stops on it (stop()), and on SIGTERM.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sparkbatch_dagster.cli", "serve-batch", "--root", str(tmp / "root"),
                 "--port", str(self.port), "--engine-file", str(tmp / "engine.py"), "--shard-size", "10", *args,
                 *options],
                cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        finally:
            signal.signal(signal.SIGINT, previous)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=api_key or "none",
                                    max_retries=0)
        self.wait(self._up, "the server to answer")

    def _up(self) -> bool:
        assert self.proc.poll() is None, (self.tmp / "server.log").read_text()[-3000:]
        try:
            self.client.batches.list(limit=1)
        except openai.APIConnectionError:
            return False
        except openai.AuthenticationError:
            return True
        return True

    def wait(self, done: Callable[[], Any], what: str, deadline_s: float = 300.0) -> Any:
        """Poll ``done`` until it returns something true (a state the server reports)."""
        return wait_until(what, done, lambda: (self.tmp / "server.log").read_text()[-3000:], deadline_s)

    def batch(self, bid: str, *states: str, least: int = 0, deadline_s: float = 300.0) -> Any:
        """The batch once its status is one of ``states`` with at least ``least`` rows answered."""
        def reached() -> Any:
            b = self.client.batches.retrieve(bid)
            return b if b.status in states and b.request_counts.completed >= least else None

        return self.wait(reached, f"batch {bid} to be {states} with {least}+ answers", deadline_s)

    def kill(self) -> None:
        """SIGKILL, as an OOM kill or a lost box: no cleanup of its own runs."""
        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        self.proc.wait()
        psutil.wait_procs(children, timeout=60)  # the kernel stops them (their parent-death signal)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    def stop(self) -> None:
        """SIGINT, as Ctrl-C (or SIGTERM, as docker stop) stops it: the server must end by itself."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(60)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    raise AssertionError("serve-batch did not stop on SIGINT") from None
        finally:
            self.log.close()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        s.stop()


def _results(client: Any, batch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The output and error files' lines, as the client downloads them."""
    def lines(fid: str | None) -> list[dict[str, Any]]:
        return [json.loads(x) for x in client.files.content(fid).text.splitlines()] if fid else []

    return lines(batch.output_file_id), lines(batch.error_file_id)


def test_a_batch_runs_from_the_openai_client_to_its_result_files(tmp_path, servers):
    from openai.types.chat import ChatCompletion

    ids = _requests(tmp_path / "requests.jsonl")
    servers.append(server := Server(tmp_path, "FakeVLLMResource()"))
    client = server.client
    uploaded = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    assert client.files.retrieve(uploaded.id).bytes == (tmp_path / "requests.jsonl").stat().st_size
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"team": "labels"})
    assert batch.status == "validating" and batch.request_counts.total == N + 2 and batch.metadata == {"team": "labels"}
    done = server.batch(batch.id, "completed")
    out, err = _results(client, done)
    assert done.request_counts.completed == len(out) == N and done.request_counts.failed == len(err) == 2
    assert sorted(line["custom_id"] for line in out) == sorted(ids)  # every request once
    for line in out:
        answer = ChatCompletion.model_validate(line["response"]["body"])  # the client's own type
        assert answer.choices[0].message.content and line["response"]["status_code"] == 200
    assert {line["response"]["status_code"] for line in err} == {400}
    assert sorted(line["custom_id"] for line in err) == ["bad-0", "bad-1"]  # the user's own ids
    assert [b.id for b in client.batches.list(limit=10)] == [batch.id]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="upload it"):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


def test_a_batch_cancelled_halfway_keeps_its_finished_rows(tmp_path, servers):
    gate = tmp_path / "gate"
    ids = _requests(tmp_path / "requests.jsonl")
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15)"))
    client = server.client
    uploaded = client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    server.batch(batch.id, "in_progress", least=10)  # a shard committed; the engine now held at its gate
    queued = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
    ended = client.batches.cancel(queued.id)  # waiting behind the first: it ends now, with nothing run
    assert ended.status == "cancelled" and ended.request_counts.completed == 0 and ended.output_file_id is None
    _, never_run = _results(client, ended)  # each request once, as OpenAI's error line of a request not run
    assert sorted(line["custom_id"] for line in never_run) == sorted([*ids, "bad-0", "bad-1"])
    assert {line["error"]["code"] for line in never_run} == {"batch_cancelled"} and ended.request_counts.failed == N + 2
    assert client.batches.cancel(batch.id).status == "cancelling"
    cancelled = server.batch(batch.id, "cancelled")
    out, err = _results(client, cancelled)
    got = [line["custom_id"] for line in out]
    assert 10 <= len(got) < N and len(set(got)) == len(got) == cancelled.request_counts.completed
    assert all(line["response"]["status_code"] == 200 for line in out)
    assert sorted(got + [line["custom_id"] for line in err]) == sorted([*ids, "bad-0", "bad-1"])  # the rest: errors
    assert cancelled.request_counts.failed == len(err)
    # The bad lines' own 400 answers, and the requests never run: no HTTP answer, ``error`` batch_cancelled.
    assert {"batch_cancelled"} == {line["error"]["code"] for line in err if line["response"] is None}
    assert {line["response"]["status_code"] for line in err if line["error"] is None} <= {400}
    assert client.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing


def test_a_killed_server_finishes_its_batch_when_started_again(tmp_path, servers):
    gate, trace = tmp_path / "gate", tmp_path / "trace.txt"
    ids = _requests(tmp_path / "requests.jsonl")
    engine = f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=15, trace_path={str(trace)!r})"
    servers.append(first := Server(tmp_path, engine))
    uploaded = first.client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = first.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                        completion_window="24h")
    before = first.batch(batch.id, "in_progress", least=10)
    first.kill()
    asked_before = trace.read_text().split()
    gate.touch()
    servers.append(second := Server(tmp_path, engine))
    done = second.batch(batch.id, "completed")
    out, err = _results(second.client, done)
    assert sorted(line["custom_id"] for line in out) == sorted(ids) and len(err) == 2  # every custom_id once
    assert done.created_at == before.created_at and done.input_file_id == uploaded.id
    # The rows the first server's run had committed were not asked again.
    asked = trace.read_text().split()
    assert len(asked) - len(asked_before) <= N - 10


def test_a_server_other_machines_can_reach_needs_a_key(tmp_path, servers):
    with pytest.raises(ConfigError, match="--api-key"):
        check_bind("0.0.0.0", None)  # noqa: S104 - the refusal is the point
    check_bind("0.0.0.0", "k")  # noqa: S104
    check_bind("127.0.0.1", None)
    servers.append(server := Server(tmp_path, "FakeVLLMResource()", api_key="s3cret"))
    wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.batches.list()
    assert server.client.batches.list().data == []
