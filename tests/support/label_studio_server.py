"""A real Label Studio server on loopback, from the virtualenv ``make label-studio`` installs
(``.ls-venv``, label-studio 1.23.2): what tests/e2e/test_label_studio.py and
benchmarks/label_studio_roundtrip.py talk to.

Its data (SQLite database, uploads) lives in a folder of its own; its first user and that user's
API token are set by Label Studio's own variables (``LABEL_STUDIO_USERNAME``, ``_PASSWORD``,
``_USER_TOKEN``; ``LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true`` lets that fixed token in, as the SDK
sends it: ``Authorization: Token ...``), and it never asks PyPI for a newer release
(``LATEST_VERSION_CHECK=false``). Ready means its ``/health`` answers, polled until then. A
watchdog thread ends it when its parent dies, even by SIGKILL.

Example::

    with LabelStudioServer.start(tmp_path / "ls") as ls:
        client = LabelStudio(base_url=ls.url, api_key=ls.token)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import urllib.request
from pathlib import Path

from child_server import ChildServer, watched

from sparkbatch_dagster.engines.server.server_process import free_port

REPO = Path(__file__).resolve().parents[2]
LS_VENV = REPO / ".ls-venv"
LS_PYTHON = LS_VENV / "bin" / "python"
#: The test user Label Studio creates at its start, and its API token (legacy token: fixed, no expiry).
USER, PASSWORD, TOKEN = "sparkbatch-tests@example.com", "sparkbatch-tests-password", "sparkbatch0test0token0123"
#: ``label-studio start`` inside a watchdog: the server exits when the process that started it dies.
_RUN = watched("""
from label_studio.server import main
sys.argv = ["label-studio", *sys.argv[1:]]
main()
""")


def installed() -> bool:
    """Whether ``make label-studio`` has installed the server (its virtualenv and its stamp)."""
    return LS_PYTHON.exists() and any(LS_VENV.glob(".installed-*"))


class LabelStudioServer(ChildServer):
    """One Label Studio process: ``url`` and ``token`` are what a client needs; ``log`` its output."""

    STOP_TIMEOUT = 10.0

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.token = TOKEN

    @classmethod
    def start(cls, folder: Path, timeout: float = 300.0, drop_env: tuple[str, ...] = ()) -> LabelStudioServer:
        """Start a server whose data lives in ``folder`` and wait until it answers (``timeout``
        bounds a hang: the first start migrates a new database, about a minute on two busy cores).
        ``drop_env``: variables of this process the server must not inherit."""
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in drop_env and k != "PYTHONPATH"}
        env.update({"LABEL_STUDIO_BASE_DATA_DIR": str(folder / "data"), "LABEL_STUDIO_USERNAME": USER,
                    "LABEL_STUDIO_PASSWORD": PASSWORD, "LABEL_STUDIO_USER_TOKEN": TOKEN,
                    "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", "LATEST_VERSION_CHECK": "false"})
        log = folder / "label-studio.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(LS_PYTHON), "-c", _RUN, "start", "--no-browser", "--internal-host",
                                     "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=folder)
        server = cls(proc, port, log)
        atexit.register(server.stop)  # an interrupted session leaves no server behind (SIGKILL: the watchdog)
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def healthy(self) -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
            return bool(r.status == 200 and b"UP" in r.read())
        return False

    def _wait_ready(self, timeout: float) -> None:
        """Poll ``/health``; between two polls, wait for the process to exit (it never should)."""
        import time

        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Label Studio did not answer {self.url}/health within {timeout:.0f} s; its log "
                                   f"{self.log}:\n{self.log.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.25)
                raise RuntimeError(f"Label Studio exited with {self.proc.returncode} before it answered; its log "
                                   f"{self.log}:\n{self.log.read_text(errors='replace')[-3000:]}")
