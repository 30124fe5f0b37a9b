"""One engine per GPU on the box, whatever the Dagster instance: a run that would start an engine
on devices another run's engine holds waits for them (a WARNING names that run), and the locks
go with the engine (closed, or its process killed). Servers someone else runs, and runs whose
answers are all stored, take no lock."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import testkit
from sparkbatch_dagster import VLLMResource
from sparkbatch_dagster.engines import FakeEngine, LazyEngine, gpu_lock, settings
from sparkbatch_dagster.engines.base import EngineRequest
from sparkbatch_dagster.engines.gpu_lock import DeviceLock, HeldEngine, lock_path, wait_for_stops
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec
from sparkbatch_dagster.testing import FakeVLLMResource

WAIT_S = 120.0  # only a guard: every step below waits for a signal, not for time



def held_elsewhere(path: Path) -> bool:
    """True when some engine holds the lock file (probed through a descriptor of our own, which
    conflicts with every other one, even in this process)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def wait_until(what: str, ok: Callable[[], bool], explain: Callable[[], str] = lambda: "") -> None:
    testkit.wait_until(what, ok, explain, WAIT_S)


def test_engines_of_one_process_share_its_lock(_gpu_lock_dir):
    first = DeviceLock.acquire(["cpu0"], {}, log=pytest.fail)
    second = DeviceLock.acquire(["cpu0"], {}, log=pytest.fail)  # a keep_warm engine of other settings
    first.release()
    assert held_elsewhere(lock_path("cpu0"))
    second.release()
    second.release()  # twice is once
    assert not held_elsewhere(lock_path("cpu0"))


def test_an_unwritable_lock_folder_names_the_fix(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPARKBATCH_GPU_LOCK_DIR", str(blocker / "locks"))
    with pytest.raises(Exception, match=r"cannot open the GPU lock .*set SPARKBATCH_GPU_LOCK_DIR to a folder"):
        DeviceLock.acquire(["0"], {}, log=pytest.fail)


# --- what a resource locks -------------------------------------------------------------------------


def test_the_devices_an_engine_locks(monkeypatch):
    assert VLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m").engine_settings().devices() == []
    monkeypatch.setattr(settings, "on_cpu", lambda: True)
    assert VLLMResource().engine_settings().devices() == ["cpu0"]
    assert VLLMResource(engine="server").engine_settings().devices() == ["cpu0"]  # `vllm serve` started here
    monkeypatch.setattr(settings, "on_cpu", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5")
    assert VLLMResource().engine_settings().devices() == ["2", "3", "4", "5"]  # one engine per visible GPU
    assert VLLMResource(data_parallel_size=1).engine_settings().devices() == ["2"]
    assert VLLMResource(data_parallel_size=1, tensor_parallel_size=2).engine_settings().devices() == ["2", "3"]
    assert VLLMResource(engine="server", data_parallel_size=1).engine_settings().devices() == ["2"]


def test_the_fake_resource_holds_its_devices_while_its_engine_lives(monkeypatch):
    res = FakeVLLMResource(gpu_lock=True)
    res.get_engine()
    assert held_elsewhere(lock_path("cpu0"))
    assert json.loads(lock_path("cpu0").read_text())["pid"] == os.getpid()
    res.close()
    wait_for_stops()  # the engine stops in the background; its lock goes with it
    assert not held_elsewhere(lock_path("cpu0"))
    warm = FakeVLLMResource(gpu_lock=True, keep_warm=True, tensor_parallel_size=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    try:
        warm.get_engine()
        warm.close()  # kept warm: so are its GPUs
        assert held_elsewhere(lock_path("3")) and held_elsewhere(lock_path("5"))
    finally:
        warm.shutdown()
    assert not held_elsewhere(lock_path("3")) and not held_elsewhere(lock_path("5"))
    assert not FakeVLLMResource()._lock_devices()  # off by default: tests that play two boxes


class SlowStop(FakeEngine):
    """An engine whose stop lasts until the test releases it."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release, self.stopped_on = release, ""

    def close(self) -> None:
        self.stopped_on = threading.current_thread().name
        assert self.release.wait(WAIT_S)
        super().close()


def test_an_engine_stops_in_the_background_and_holds_its_gpu_until_it_is_gone():
    release = threading.Event()
    engine = SlowStop(release)
    held = HeldEngine.start(["7"], {"run_id": "r1"}, print, lambda: engine)
    held.close(background=True)  # returns while the engine is still stopping
    wait_until("the stop began", lambda: engine.stopped_on != "")
    assert held_elsewhere(lock_path("7")) and not engine.closed
    release.set()
    assert wait_for_stops() >= 0.0
    assert engine.closed and engine.stopped_on == "sparkbatch-engine-stop"
    assert not held_elsewhere(lock_path("7"))


def test_the_next_start_in_this_process_waits_for_a_stop_in_the_background(monkeypatch):
    """Locks count per process, so only this wait keeps a second engine from loading beside one
    still stopping (on the CPU backend: two engines' memory at once)."""
    release, waiting = threading.Event(), threading.Event()
    first = SlowStop(release)
    real_wait = gpu_lock.wait_for_stops

    def wait() -> float:
        waiting.set()
        return real_wait()

    monkeypatch.setattr(gpu_lock, "wait_for_stops", wait)
    HeldEngine.start(["7"], {"run_id": "r1"}, print, lambda: first).close(background=True)
    seen: dict[str, bool] = {}

    def second() -> FakeEngine:
        seen["first closed"] = first.closed
        return FakeEngine()

    starting = threading.Thread(target=lambda: seen.setdefault("held", bool(
        HeldEngine.start(["7"], {"run_id": "r2"}, print, second))))
    starting.start()
    assert waiting.wait(WAIT_S), "the start did not wait for the engine stopping in the background"
    assert "first closed" not in seen
    release.set()
    starting.join(WAIT_S)
    assert seen == {"first closed": True, "held": True}


def test_a_failed_start_frees_the_gpus(monkeypatch):
    class Broken(FakeVLLMResource):
        def _start(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("no engine today")

    with pytest.raises(RuntimeError):
        Broken(gpu_lock=True).get_engine()
    assert not held_elsewhere(lock_path("cpu0"))


def test_the_wait_is_not_billed_as_the_engine_start():
    started = FakeEngine()
    started.gpu_wait_s = 3600.0  # an hour behind another run's engine
    lines: list[str] = []
    engine = LazyEngine("fake-model", lambda: started, log=lines.append)
    list(engine.generate([EngineRequest("a", [{"role": "user", "content": "x"}])], SamplingSpec(max_tokens=2),
                         OutputSpec()))
    assert engine.start_seconds == 0.0
    assert "(after 3600.0 s waiting for the GPU)" in lines[1]
