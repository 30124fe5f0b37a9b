"""``serve-batch`` at its edges (issue 59): killed with SIGKILL mid-batch, its ``run-batch`` child
is gone within 10 s and wrote no partial export (it took the server's death for Ctrl-C and
exported while its engine lived on); a ``--model`` that does not exist stops it at start with
one line naming the value and the fix (it used to start, take uploads and fail every batch);
``--help`` names the Anthropic endpoints. The same kill on the real engine (its
``VLLM::EngineCore`` gone too): tests/real/test_serve_batch_kill.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from e2e.test_serve_batch import ROOT, Server, _requests, servers  # noqa: F401 - servers: the fixture

pytest.importorskip("openai")
#: What the issue asks of a killed server's children.
GONE_WITHIN_S = 10


def kill_mid_batch(tmp_path: Path, server: Server) -> tuple[str, list[psutil.Process]]:
    """Start a batch on ``server``, SIGKILL the server once its run is under way, and return the
    batch's id and the processes the server had started."""
    _requests(tmp_path / "requests.jsonl")
    uploaded = server.client.files.create(file=(tmp_path / "requests.jsonl").open("rb"), purpose="batch")
    batch = server.client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
    server.batch(batch.id, "in_progress", least=5)
    children = psutil.Process(server.proc.pid).children(recursive=True)
    assert any("run-batch" in " ".join(c.cmdline()) for c in children)
    server.proc.kill()
    server.proc.wait()
    return batch.id, children


def test_a_killed_servers_run_batch_child_goes_at_once_without_a_partial_export(tmp_path, servers):  # noqa: F811
    gate = tmp_path / "gate"  # never opened: the run holds after 5 answers until it is killed
    servers.append(server := Server(tmp_path, f"FakeVLLMResource(gate_path={str(gate)!r}, gate_after=5)"))
    bid, children = kill_mid_batch(tmp_path, server)
    _, alive = psutil.wait_procs(children, timeout=GONE_WITHIN_S)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], alive
    folder = tmp_path / "root" / "batches" / bid
    log = (folder / "run.log").read_text()
    assert "the run stopped" not in log and not (folder / "output.jsonl").exists(), log[-2000:]


def test_a_model_that_does_not_exist_stops_serve_batch_at_start(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    proc = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "serve-batch", "--model", "/no/such/folder",
                           "--root", str(tmp_path / "root"), "--port", "0"], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "--model" in lines[0] and "/no/such/folder" in lines[0] and "fix the path" in lines[0]
    assert not (tmp_path / "root").exists()  # nothing served, nothing stored


def test_serve_batch_help_names_both_apis_endpoints():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    text = subprocess.run([sys.executable, "-m", "sparkbatch_dagster.cli", "serve-batch", "--help"], env=env,
                          capture_output=True, text=True, timeout=120, check=True).stdout
    assert "/v1/batches" in text and "/v1/messages/batches" in text and "Anthropic" in text
