"""How much a ``sparkbatch serve-batch`` process grows while it takes a big batch: an OpenAI file
of short lines uploaded, then a batch created on it and validated (every line read), and an
Anthropic Message Batches create of as many bytes (issue 59: the server read the file whole and
split it, 3.1 GB more for a 159 MiB file of short lines; a Message Batches create was parsed
whole before its checks).

    python -m benchmarks.server.upload_memory --mib 500 --out benchmarks/results/upload-memory-500mib.json

The server runs as a user starts it, on the fake engine: the file's last line names another url
and the Message Batch's last request has no ``max_tokens``, so both are read to the end and then
refused, and no batch runs (what is measured is the server taking the bytes in, not a run's
child). Each step's growth is the server's peak resident memory during the step (``VmHWM``,
reset before it through ``/proc/<pid>/clear_refs``) less its resident memory before it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import machine
from benchmarks.lib.results_io import commit_of, emit

ROOT = Path(__file__).resolve().parents[2]

MIB = 1024 * 1024
URL = "/v1/chat/completions"


def openai_file(path: Path, size: int) -> int:
    """About ``size`` bytes of short request lines at ``path``, the last with another url (the
    batch fails validation once every line is read); returns the line count."""
    n = 0
    with path.open("wb") as out:
        while out.tell() < size:
            out.write(b'{"custom_id":"r%d","method":"POST","url":"%s","body":{"messages":[{"role":"user",'
                      b'"content":"q%d"}]}}\n' % (n, URL.encode(), n))
            n += 1
        out.write(b'{"custom_id":"last","method":"POST","url":"/v1/embeddings","body":{}}\n')
    return n + 1


def anthropic_body(path: Path, size: int, requests: int) -> None:
    """A Message Batches create body of about ``size`` bytes in ``requests`` requests, the last
    without ``max_tokens`` (refused once every request before it was checked)."""
    filler = "x" * max(1, size // requests - 120)
    with path.open("w") as out:
        out.write('{"requests": [')
        for i in range(requests):
            params: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": filler}]}
            if i < requests - 1:
                params["max_tokens"] = 8
            out.write(("," if i else "") + json.dumps({"custom_id": f"r{i}", "params": params}))
        out.write("]}")


def vm(pid: int) -> dict[str, int]:
    """The process's ``VmRSS`` and ``VmHWM`` in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def reset_peak(pid: int) -> int:
    """Reset the process's peak (``VmHWM``) to its resident memory now; return that."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return vm(pid)["VmRSS"]


class Served:
    """``serve-batch`` on the fake engine in its own process, under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        from sparkbatch_dagster.engines.server.server_process import free_port

        (tmp / "engine.py").write_text("from sparkbatch_dagster.testing import FakeVLLMResource\n"
                                       "resource = FakeVLLMResource()\n")
        self.port, self.log = free_port(), (tmp / "server.log").open("ab")
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DAGSTER_HOME": str(tmp / "dagster_home")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparkbatch_dagster.cli", "serve-batch", "--root", str(tmp / "root"), "--port",
             str(self.port), "--engine-file", str(tmp / "engine.py"), "--max-upload-mb", "1024"],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        self.until(lambda: self._get("/v1/batches") is not None, "the server to answer")

    def _get(self, path: str) -> Any:
        import httpx

        try:
            return httpx.get(self.url + path, timeout=30).json()
        except httpx.TransportError:
            assert self.proc.poll() is None, "the server exited"
            return None

    def until(self, done: Any, what: str, deadline_s: float = 1800) -> Any:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            got = done()
            if got:
                return got
            time.sleep(0.2)
        raise TimeoutError(what)

    def upload_and_validate(self, path: Path) -> dict[str, Any]:
        """Growth of the upload, then of the batch's create and validation (until it fails)."""
        import httpx

        before = reset_peak(self.proc.pid)
        with path.open("rb") as fh:
            uploaded = httpx.post(self.url + "/v1/files", files={"file": ("big.jsonl", fh)},
                                  data={"purpose": "batch"}, timeout=3600).json()
        upload_peak = vm(self.proc.pid)["VmHWM"]
        created = reset_peak(self.proc.pid)
        batch = httpx.post(self.url + "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": URL,
                                                           "completion_window": "24h"}, timeout=3600).json()
        ended = self.until(lambda: (b := self._get(f"/v1/batches/{batch['id']}")) and b["status"] == "failed" and b,
                           "the batch to fail validation")
        assert ended["errors"]["data"][-1]["code"] == "url_mismatch", ended["errors"]
        return {"upload_growth_mb": (upload_peak - before) / MIB,
                "create_and_validate_growth_mb": (vm(self.proc.pid)["VmHWM"] - created) / MIB}

    def message_batch(self, path: Path) -> dict[str, Any]:
        """Growth of a Message Batches create of ``path``'s body (refused at its last request)."""
        import httpx

        before = reset_peak(self.proc.pid)
        with path.open("rb") as fh:
            answer = httpx.post(self.url + "/v1/messages/batches", content=fh, timeout=3600,
                                headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "max_tokens" in answer.json()["error"]["message"], answer.text[:300]
        return {"growth_mb": (vm(self.proc.pid)["VmHWM"] - before) / MIB, "answer": answer.json()["error"]["message"]}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def measure(tmp: Path, size: int, requests: int) -> dict[str, Any]:
    """Both routes' growth for ``size`` bytes; the Message Batch in ``requests`` requests."""
    lines = openai_file(tmp / "big.jsonl", size)
    anthropic_body(tmp / "body.json", size, requests)
    server = Served(tmp)
    try:
        openai = server.upload_and_validate(tmp / "big.jsonl")
        anthropic = server.message_batch(tmp / "body.json")
    finally:
        server.stop()
    file_mb, body_mb = (tmp / "big.jsonl").stat().st_size / MIB, (tmp / "body.json").stat().st_size / MIB
    return {"openai": {"file_mb": file_mb, "lines": lines, **openai,
                       "growth_over_size": max(openai.values()) / file_mb},
            "anthropic": {"body_mb": body_mb, "requests": requests, **anthropic,
                          "growth_over_size": anthropic["growth_mb"] / body_mb}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mib", type=int, default=500, help="the file's and the body's size")
    p.add_argument("--requests", type=int, default=100_000, help="the Message Batch's requests (Anthropic's most)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp), args.mib * MIB, args.requests)
    emit({"benchmark": "upload_memory", "machine": machine(cpu_only=True),
          "code": commit_of(ROOT), "command": "python " + " ".join(sys.argv), "mib": args.mib, **result}, args.out)


if __name__ == "__main__":
    main()
