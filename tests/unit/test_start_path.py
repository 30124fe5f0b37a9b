"""The engine start as fast as raw vLLM's (issue 61): its own steps cost milliseconds (the device
facts come from NVML where it can tell a discrete GPU; the torch probe, a child process importing
torch, 3 to 5 s, runs only where it cannot: a GB10, a MIG slice, no NVML), a start begun ahead
(``sparkbatch run``) is the one the run's resource takes, and the compile cache's save runs while
the engine works and after its stop has begun, never before it answers. Events, not sleeps."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from sparkbatch_dagster.definitions import prestart
from sparkbatch_dagster.engines.platform import memory
from sparkbatch_dagster.spec import OutputSpec, SamplingSpec


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[tuple[str, int | None]], uuids: dict[str, int] | None = None) -> types.ModuleType:
    """A stand-in for ``pynvml`` over ``gpus`` (name, total bytes; None: memory not supported)."""
    mod = types.ModuleType("pynvml")
    state = {"open": 0}

    def init() -> None:
        state["open"] += 1

    def shutdown() -> None:
        state["open"] -= 1

    def memory_info(i: int) -> Any:
        total = gpus[i][1]
        if total is None:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(total=total)

    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByUUID = lambda u: (uuids or {})[u]  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda i: gpus[i][0].encode()  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory_info  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The torch probe's child process, recorded instead of run (it answers as a GB10)."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='["NVIDIA GB10", true, 130668003328]\n', stderr="")

    monkeypatch.setattr(memory.subprocess, "run", run)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    memory.device.cache_clear()
    yield calls
    memory.device.cache_clear()


H100 = ("NVIDIA H100 80GB HBM3", 85_520_809_984)


def test_a_discrete_gpu_is_read_from_nvml_without_the_torch_probe(monkeypatch: pytest.MonkeyPatch,
                                                                   probe: list[list[str]]) -> None:
    nvml = fake_nvml([H100, H100])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    dev = memory.device()
    assert dev == memory.Device("NVIDIA H100 80GB HBM3", False, 85_520_809_984)
    assert probe == []  # no child process importing torch
    assert nvml.state["open"] == 0  # NVML shut down again


@pytest.mark.parametrize("gpus, visible", [
    ([("NVIDIA GB10", None)], None),  # unified memory: NVML has no memory of its own to report
    ([("NVIDIA GB10", 130_668_003_328)], None),  # a GB10 by name, whatever NVML reports
    ([H100, ("NVIDIA L40S", 48_000_000_000)], None),  # two models: CUDA's order may not be NVML's
    ([H100], "MIG-1f2e"),  # a MIG slice
    ([H100], ""),  # no GPU visible to this process
    ([], None),  # NVML lists none
])
def test_what_nvml_cannot_tell_is_left_to_the_torch_probe(monkeypatch: pytest.MonkeyPatch, probe: list[list[str]],
                                                          gpus: list[tuple[str, int | None]],
                                                          visible: str | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert memory.discrete_from_nvml() is None
    assert memory.device() == memory.Device("NVIDIA GB10", True, 130_668_003_328)  # the probe's answer
    assert len(probe) == 1


def test_the_visible_gpu_is_the_one_read(monkeypatch: pytest.MonkeyPatch, probe: list[list[str]]) -> None:
    small = ("NVIDIA H100 80GB HBM3", 1_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([H100, small], uuids={"GPU-abc": 1}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert memory.discrete_from_nvml() == memory.Device(small[0], False, 1_000)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert memory.discrete_from_nvml() == memory.Device(small[0], False, 1_000)


def test_no_nvml_or_a_broken_one_falls_back_to_the_probe(monkeypatch: pytest.MonkeyPatch,
                                                         probe: list[list[str]]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert memory.discrete_from_nvml() is None
    broken = fake_nvml([H100])

    def refuse() -> None:
        raise NVMLError("Driver Not Loaded")

    broken.nvmlInit = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert memory.discrete_from_nvml() is None
    assert memory.device() is not None and len(probe) == 1


# --- an engine started ahead: the run's resource takes it, the caller goes on meanwhile ---------------


@pytest.fixture
def gated_start(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """FakeVLLMResource's start, held until ``go`` is set; ``began`` is set as it begins."""
    from sparkbatch_dagster.testing import FakeVLLMResource

    gate: dict[str, Any] = {"began": threading.Event(), "go": threading.Event(), "starts": 0}
    real = FakeVLLMResource._start

    def start(self: Any) -> Any:
        gate["starts"] += 1
        gate["began"].set()
        if not gate["go"].wait(60):
            raise AssertionError("the start was never let go")
        return real(self)

    monkeypatch.setattr(FakeVLLMResource, "_start", start)
    yield gate
    gate["go"].set()
    prestart.close_untaken()


def test_a_start_begun_ahead_is_the_engine_the_runs_copy_of_the_resource_gets(gated_start: dict[str, Any]) -> None:
    from sparkbatch_dagster.testing import FakeVLLMResource

    early = FakeVLLMResource().prestart()
    assert early is not None and gated_start["began"].wait(60)
    assert early.in_flight  # this thread goes on while the engine starts
    assert FakeVLLMResource().prestart() is None  # one pending start per settings
    gated_start["go"].set()
    copy = FakeVLLMResource()  # a Dagster run's own resource object, the same settings
    engine = copy.get_engine()
    assert gated_start["starts"] == 1 and engine is early.wait()[0].engine
    assert copy.cold_starts() == 1  # this run paid for that start
    copy.close()
    other = FakeVLLMResource(answer="x")  # other settings: not the start begun ahead
    other.get_engine()
    assert gated_start["starts"] == 2
    other.close()


def test_a_start_nobody_takes_is_stopped_at_the_end(gated_start: dict[str, Any]) -> None:
    from sparkbatch_dagster.testing import FakeVLLMResource

    early = FakeVLLMResource().prestart()
    assert early is not None
    gated_start["go"].set()
    assert prestart.close_untaken() == 1
    assert early.wait()[0].engine.closed
    assert not prestart.pending(FakeVLLMResource()._warm_key())


def test_servers_someone_else_runs_are_not_started_ahead() -> None:
    from sparkbatch_dagster.testing import FakeVLLMResource

    assert FakeVLLMResource(engine="server", server_url="http://127.0.0.1:1", model="m").prestart() is None


# --- the compile cache costs the start nothing: saved while the engine works ------------------------


def test_the_compile_cache_is_saved_after_the_start_returns_and_the_run_end_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkbatch_dagster.definitions import compile_cache as dcc
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.testing import FakeVLLMResource

    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    packing, release = threading.Event(), threading.Event()
    released: list[bool] = []  # per pack: let go by the test, which a save inside the start would block
    real_pack = dcc.cc.pack

    def slow_pack(*args: Any, **kwargs: Any) -> int:
        packing.set()
        released.append(release.wait(60))
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(dcc.cc, "pack", slow_pack)
    monkeypatch.setattr(dcc.cc, "device", lambda: "cpu Test CPU [avx2]")  # nvidia-smi: a process
    home = JobHome(tmp_path / "home")
    res = FakeVLLMResource(compile_cache=True)
    res.use_home(home, logging.getLogger("test"))
    engine = res.get_engine()  # returns while the save is held: it is not part of the start
    assert engine.compiled_from_cache is False and packing.wait(60)
    assert not list(home.root.glob("compile-cache/*.tar.gz"))  # not saved yet, and the engine answers
    assert list(engine.generate([], SamplingSpec(), OutputSpec())) == []
    release.set()
    res.close()  # the run's end waits for the save
    assert released == [True]  # one save, begun after the start returned
    assert len(list(home.root.glob("compile-cache/*.tar.gz"))) == 1


def test_the_engine_stop_begins_before_the_compile_cache_last_save(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkbatch_dagster.definitions.compile_cache import CompileCacheRun
    from sparkbatch_dagster.engines.gpu_lock import wait_for_stops
    from sparkbatch_dagster.testing import FakeVLLMResource

    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    res = FakeVLLMResource()
    engine = res.get_engine()
    stopping = threading.Event()
    real_close = type(engine).close

    def close(self: Any) -> None:
        stopping.set()
        real_close(self)

    monkeypatch.setattr(type(engine), "close", close)
    seen: list[bool] = []

    def finish(self: Any) -> None:  # the GPU is not held for the cache's save
        seen.append(stopping.wait(60))

    monkeypatch.setattr(CompileCacheRun, "finish", finish)
    res._cache_run = CompileCacheRun.__new__(CompileCacheRun)
    res.close()
    wait_for_stops()
    assert seen == [True]


def test_vllm_is_imported_in_the_callers_thread_before_the_start_thread_begins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the start's thread, the import ran beside sharding and each slowed the other (the job
    8 s longer on an H200): the caller imports, then the start (``vllm.LLM``) overlaps its work."""
    from sparkbatch_dagster import VLLMResource
    from sparkbatch_dagster.engines import FakeEngine
    from sparkbatch_dagster.testing import dummy_model

    began = threading.Event()
    seen: list[tuple[str, threading.Thread, bool]] = []

    class Vllm(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):  # the import system's own questions
                raise AttributeError(name)
            seen.append((name, threading.current_thread(), began.is_set()))
            return object

    def start(self: Any) -> Any:
        began.set()
        return FakeEngine(model_id=self.model_identity())

    monkeypatch.setitem(sys.modules, "vllm", Vllm("vllm"))
    monkeypatch.setattr(VLLMResource, "_start", start)
    monkeypatch.setattr(VLLMResource, "_lock_devices", lambda self: [])
    res = VLLMResource(model=str(dummy_model("tiny", tmp_path / "m")), compile_cache=False)
    early = res.prestart()
    assert early is not None
    assert ("LLM", threading.current_thread(), False) in seen  # here, and before the start began
    assert early.wait()[0].engine.model_id == res.model_identity()
    assert prestart.close_untaken() == 1


def test_the_compile_cache_is_restored_while_the_caller_imports_vllm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore (a download and an unpack from a bucket on a new machine) runs in the start's
    thread beside the caller's ``import vllm``, and ``vllm.LLM`` begins only after both."""
    from sparkbatch_dagster import VLLMResource
    from sparkbatch_dagster.definitions import compile_cache as dcc
    from sparkbatch_dagster.engines import FakeEngine
    from sparkbatch_dagster.home import JobHome
    from sparkbatch_dagster.testing import dummy_model

    restoring, imported = threading.Event(), threading.Event()
    order: list[str] = []

    class Vllm(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            order.append(f"import sees the restore: {restoring.wait(60)}")  # a barrier, not a sleep
            imported.set()
            return object

    def restore(self: Any) -> None:
        restoring.set()
        order.append("restore")

    def start(self: Any) -> Any:
        order.append(f"start after the import: {imported.is_set()}")
        return FakeEngine(model_id=self.model_identity())

    monkeypatch.setenv("SPARKBATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dcc.cc, "device", lambda: "cpu Test CPU [avx2]")
    monkeypatch.setattr(dcc.CompileCacheRun, "restore", restore)
    monkeypatch.setitem(sys.modules, "vllm", Vllm("vllm"))
    monkeypatch.setattr(VLLMResource, "_start", start)
    monkeypatch.setattr(VLLMResource, "_lock_devices", lambda self: [])
    res = VLLMResource(model=str(dummy_model("tiny", tmp_path / "m")), compile_cache=True)
    res.use_home(JobHome(tmp_path / "home"), logging.getLogger("test"))
    early = res.prestart()
    assert early is not None
    early.wait()[1].finish()
    assert order == ["restore", "import sees the restore: True", "start after the import: True"]
    assert prestart.close_untaken() == 1


def test_a_failed_import_starts_no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkbatch_dagster import VLLMResource
    from sparkbatch_dagster.testing import dummy_model

    starts: list[int] = []

    def broken(self: Any) -> None:
        raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(VLLMResource, "_import_engine", broken)
    monkeypatch.setattr(VLLMResource, "_start", lambda self: starts.append(1))
    res = VLLMResource(model=str(dummy_model("tiny", tmp_path / "m")), compile_cache=False)
    with pytest.raises(OSError, match="libcudart"):
        res.prestart()
    assert prestart.close_untaken() == 1  # the begun start ended in the import's error, not an engine
    assert starts == []


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, fail: bool) -> list[int]:
    """A ``vllm`` module whose ``LLM(...)`` records what a child forked there would inherit: the
    parent's frozen object count (vLLM forks its engine core inside the constructor)."""
    from sparkbatch_dagster.engines.platform import orphans

    seen: list[int] = []

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            import gc

            seen.append(gc.get_freeze_count())
            if fail:
                raise RuntimeError("CUDA out of memory")

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setattr(orphans, "watch_descendants", lambda: 0)  # its watchdog is a process
    return seen


@pytest.mark.parametrize("fail", [False, True])
def test_the_engine_core_is_forked_from_a_frozen_heap_and_the_heap_comes_back(monkeypatch: pytest.MonkeyPatch,
                                                                             fail: bool) -> None:
    """The engine core's collector skips the objects it inherits (issue 61), and this process's
    collector gets them back once the start ends, whether it started or failed."""
    import gc

    from sparkbatch_dagster.engines.offline.llm_start import start_llm
    from sparkbatch_dagster.errors import EngineError

    seen = _fake_vllm(monkeypatch, fail)
    before, thresholds, alive = gc.get_freeze_count(), gc.get_threshold(), len(gc.get_objects())
    if fail:
        with pytest.raises(EngineError, match="could not start"):
            start_llm("m", {}, None)
    else:
        start_llm("m", {}, None)
    assert seen and seen[0] >= before + alive // 2, "the fork would inherit an unfrozen heap"
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds
