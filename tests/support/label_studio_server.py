"""A real Label Studio server on loopback, from the virtualenv ``make label-studio`` installs
(``.ls-venv``, label-studio 1.23.2): what tests/e2e/test_label_studio.py and
benchmarks/labels/label_studio_roundtrip.py talk to.

Its data (SQLite database, uploads) lives in a folder of its own; its first user and that user's
API token are set by Label Studio's own variables (``LABEL_STUDIO_USERNAME``, ``_PASSWORD``,
``_USER_TOKEN``; ``LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true`` lets that fixed token in, as the SDK
sends it: ``Authorization: Token ...``), and it never asks PyPI for a newer release
(``LATEST_VERSION_CHECK=false``). Ready means its ``/health`` answers, polled until then. A
watchdog thread ends it when its parent dies, even by SIGKILL.

It starts with the command docs/labels.md gives a user (:func:`docs_command`: its executable, its
arguments, its variables, read from the docs), with a free loopback port added, so a broken install
or a command the docs get wrong fails the e2e tier rather than a reader.

Example::

    with LabelStudioServer.start(tmp_path / "ls") as ls:
        client = LabelStudio(base_url=ls.url, api_key=ls.token)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shlex
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
DOCS = REPO / "docs" / "labels.md"
#: The docs' command, run as its own script inside a watchdog: the server exits when the process that
#: started it dies. ``sys.argv[1]`` is the executable the docs name.
_RUN = watched("""
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
""")


def docs_command(docs: Path = DOCS) -> tuple[dict[str, str], list[str]]:
    """The variables and the command line docs/labels.md's Install block starts Label Studio with
    (the line after ``make label-studio``), the executable made absolute under the repo."""
    text = docs.read_text()
    block = next((b for b in text.split("```bash")[1:] if "make label-studio" in b.split("```")[0]), None)
    lines = block.split("```")[0].strip().splitlines() if block else []
    line = next((x for x in lines if "label-studio start" in x), None)
    if line is None:
        raise AssertionError(f"{docs} has no ```bash block with `make label-studio` and a `label-studio start` line")
    words = shlex.split(line)
    n = next(i for i, w in enumerate(words) if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w))  # NAME=value ... cmd
    env = dict(w.split("=", 1) for w in words[:n])
    return env, [str(REPO / words[n]), *words[n + 1:]]


def installed() -> bool:
    """Whether ``make label-studio`` has installed the server (its virtualenv and the Makefile's stamp)."""
    return LS_PYTHON.exists() and (LS_VENV / ".installed").exists()


class LabelStudioServer(ChildServer):
    """One Label Studio process: ``url`` and ``token`` are what a client needs; ``log`` its output."""

    STOP_TIMEOUT = 10.0

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.token = TOKEN

    @classmethod
    def start(cls, folder: Path, timeout: float = 900.0, drop_env: tuple[str, ...] = ()) -> LabelStudioServer:
        """Start a server whose data lives in ``folder`` and wait until it answers (``timeout``
        bounds a hang: the first start migrates a new database, about a minute on two busy cores,
        280 s seen with a load average of 10 on them).
        ``drop_env``: variables of this process the server must not inherit."""
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        docs_env, argv = docs_command()
        env = {k: v for k, v in os.environ.items() if k not in drop_env and k != "PYTHONPATH"}
        # The docs' variables, with this server's user in place of the reader's placeholders.
        env.update(docs_env)
        env.update({"LABEL_STUDIO_BASE_DATA_DIR": str(folder / "data"), "LABEL_STUDIO_USERNAME": USER,
                    "LABEL_STUDIO_PASSWORD": PASSWORD, "LABEL_STUDIO_USER_TOKEN": TOKEN,
                    "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true", "LATEST_VERSION_CHECK": "false"})
        log = folder / "label-studio.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(LS_PYTHON), "-c", _RUN, *argv, "--internal-host", "127.0.0.1",
                                     "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
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
