"""The tiers hold: a test's tier is its folder, a test outside every tier folder stops the
collection, and a unit test that starts a process or opens a TCP socket fails, naming where it
belongs (tests/support/tiers.py)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tiers import NotAUnitTest, tier_of


def test_a_tier_is_the_folder_under_tests(tmp_path):
    tests = tmp_path / "tests"
    assert tier_of(tests / "unit" / "test_a.py", tests) == "unit"
    assert tier_of(tests / "e2e" / "deeper" / "test_b.py", tests) == "e2e"
    assert tier_of(tests / "real" / "test_c.py", tests) == "real"
    assert tier_of(tests / "browser" / "test_d.py", tests) == "browser"
    assert tier_of(tests / "test_e.py", tests) is None
    assert tier_of(tests / "slow" / "test_f.py", tests) is None
    assert tier_of(tmp_path / "elsewhere" / "unit" / "test_g.py", tests) is None


def test_a_unit_test_may_not_start_a_process():
    with pytest.raises(NotAUnitTest, match="move it to tests/e2e/"):
        subprocess.run(["true"], check=False)
    with pytest.raises(NotAUnitTest, match="started a process"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with pytest.raises(NotAUnitTest, match="forked"):
        os.fork()


def test_a_unit_test_may_not_connect_a_tcp_socket():
    with socket.socket() as s, pytest.raises(NotAUnitTest, match="connected to"):
        s.connect(("127.0.0.1", 9))
    left, right = socket.socketpair()  # a pipe in-process is no network
    left.close(), right.close()


def _tree(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    root = Path(__file__).resolve().parents[1]
    pytester.makepyfile(conftest=f"import sys; sys.path.insert(0, {str(root / 'support')!r})\n"
                                 "pytest_plugins = ['tiers']\n")
    for name, body in files.items():
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)


def test_a_test_outside_every_tier_stops_the_collection_naming_it(pytester):
    _tree(pytester, {"tests/unit/test_ok.py": "def test_ok(): pass\n",
                     "tests/misc/test_stray.py": "def test_stray(): pass\n"})
    result = pytester.runpytest_inprocess("tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tests outside a tier folder*test_stray.py*Move each into tests/unit*"])


def test_each_test_gets_its_folders_marker_and_real_tiers_also_real(pytester):
    body = "def test_here(): pass\n"
    _tree(pytester, {f"tests/{t}/test_{t}.py": body for t in ("unit", "e2e", "real", "browser")})
    for expr, expected in {"unit": ["unit"], "e2e": ["e2e"], "real": ["real", "browser"], "not real": ["unit", "e2e"],
                           "browser": ["browser"]}.items():
        result = pytester.runpytest_inprocess("tests", "-m", expr, "-q", "--co")
        listed = sorted(line.split("/")[1] for line in result.outlines if line.startswith("tests/"))
        assert listed == sorted(expected), (expr, result.outlines)


def test_the_gate_leaves_out_the_long_tests_and_long_runs_only_those(pytester):
    """make test's gate (run_tiers.py's default) and make soak (``--long``) split the tests marked
    long between them, and ``--all`` runs both: a long test is never in neither."""
    from run_tiers import SELECTIONS

    _tree(pytester, {"tests/e2e/test_x.py": "import pytest\n\ndef test_gate(): pass\n\n"
                                            "@pytest.mark.long\ndef test_soak(): pass\n\n"
                                            "LONG = pytest.param(2, marks=pytest.mark.long)\n\n"
                                            "@pytest.mark.parametrize('n', [1, LONG])\ndef test_seed(n): pass\n"})
    pytester.makeini("[pytest]\nmarkers =\n    long: make soak\n")
    ran = {}
    for selection, args in SELECTIONS.items():
        result = pytester.runpytest_inprocess("tests", "-p", "no:cacheprovider", "-v", *args)
        ran[selection] = {line.split("::")[1].split(" ")[0] for line in result.outlines if " PASSED" in line}
    assert ran["gate"] == {"test_gate", "test_seed[1]"}
    assert ran["long"] == {"test_soak", "test_seed[2]"}
    assert ran["all"] == ran["gate"] | ran["long"]
