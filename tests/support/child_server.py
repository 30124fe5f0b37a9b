"""A server a test session starts as a child process (moto's S3, Label Studio): stopped on exit from
its ``with`` block or at interpreter exit, killed when it does not stop in time, always reaped.

Example::

    class MyServer(ChildServer):
        STOP_TIMEOUT = 5.0

    with MyServer(proc) as server: ...
"""

from __future__ import annotations

import atexit
import subprocess
from typing import Any, Self

#: Put before a server's own start: the server exits when the process that started it dies, even by
#: SIGKILL (where no atexit hook runs), so a crashed test session leaves no server behind.
_WATCHDOG = """
import os, sys, threading, time
parent = os.getppid()
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
"""


def watched(start: str) -> str:
    """Python source (for ``python -c``) that runs ``start`` under the watchdog."""
    return _WATCHDOG + start.strip() + "\n"


class ChildServer:
    """The stopping half of a test's server process (``proc``); subclasses start it."""

    #: Seconds ``stop`` waits for the process to exit after SIGTERM, then again after SIGKILL.
    STOP_TIMEOUT = 5.0
    proc: subprocess.Popen[Any]

    def stop(self, timeout: float | None = None) -> None:
        """Terminate the server (kill it if it does not exit within ``timeout``) and reap it."""
        wait = self.STOP_TIMEOUT if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(wait)
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
