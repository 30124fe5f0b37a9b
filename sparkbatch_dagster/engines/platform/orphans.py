"""Engine processes never outlive the process that started them.

vLLM's engine core is a child process. It does not notice when its parent is SIGKILLed (an OOM
kill, a ``kill -9``, a CI timeout): it stays, reparented to init, holding the GPU's memory (or
the CPU's) until someone finds it. Seen here twice: a killed ``pytest`` left its
``VLLM::EngineCore`` running for 32 minutes. So a process that starts an engine also starts one
small watchdog (:func:`watch_descendants`). Once a second it notes this process's descendants;
when this process is gone, it kills the ones it last saw that are still the same processes
(pid and start time), then exits. A normal exit has closed its engines first, so there is
nothing left to kill.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

#: The watchdog: its first argument is the watched pid, its second a file to write the pids it
#: last saw into ('' for none).
_SCRIPT = """
import os, sys, time
import psutil
parent, me, report = psutil.Process(int(sys.argv[1])), psutil.Process(), sys.argv[2]
seen = []
while True:
    try:
        if not parent.is_running() or parent.status() == psutil.STATUS_ZOMBIE:
            break
        seen = [p for p in parent.children(recursive=True) if p.pid != me.pid]
    except psutil.Error:
        break
    if report:
        with open(report + ".tmp", "w") as f:
            f.write(" ".join(str(p.pid) for p in seen))
        os.replace(report + ".tmp", report)
    time.sleep(1.0)
for p in seen:
    try:
        if p.is_running():  # the same process: is_running() compares its start time too
            p.kill()
    except psutil.Error:
        pass
"""
_LOCK = threading.Lock()
_WATCHDOG: subprocess.Popen[bytes] | None = None


#: A file the watchdog rewrites with the pids it last saw (what it would kill), for a test or a
#: look at a stuck box.
REPORT_ENV = "SPARKBATCH_WATCHDOG_REPORT"


def watch_descendants() -> int:
    """Start this process's watchdog unless it runs already; return its pid. Call it before
    starting an engine (an engine core is seen at the watchdog's next look, within a second)."""
    global _WATCHDOG
    with _LOCK:
        if _WATCHDOG is None or _WATCHDOG.poll() is not None:
            # Its own session: a signal to this process's group (Ctrl-C, `timeout`) leaves it to
            # clean up after this process. No parent-death signal: outliving this process is its job.
            _WATCHDOG = subprocess.Popen(
                [sys.executable, "-c", _SCRIPT, str(os.getpid()), os.environ.get(REPORT_ENV, "")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        return _WATCHDOG.pid
