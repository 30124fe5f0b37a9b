"""The Dagster UI must load the code on a machine without vLLM: no vllm/torch at import. And
``import sparkbatch_dagster`` alone loads no Dagster (about a CPU second: an engine's subprocess,
``python -m sparkbatch_dagster.engines...``, has no use for it); its Dagster names load on use."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules_after(code: str) -> set[str]:
    return set(subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.split())


def _loaded_after(code: str) -> set[str]:
    return {m.split(".")[0] for m in _modules_after(code)}


def test_package_import_loads_neither_vllm_nor_torch():
    mods = _loaded_after("import sparkbatch_dagster; from sparkbatch_dagster import *")
    assert "dagster" in mods
    assert not {"vllm", "torch", "transformers", "deltalake"} & mods


def test_deployment_definitions_load_without_vllm_or_torch():
    mods = _loaded_after("import definitions; definitions.defs.get_repository_def()")
    assert not {"vllm", "torch", "transformers", "deltalake"} & mods


def test_the_package_alone_loads_no_dagster_and_its_dagster_names_load_on_use():
    assert "dagster" not in _loaded_after("import sparkbatch_dagster; sparkbatch_dagster.JobSpec")
    assert "matplotlib" not in _loaded_after("import sparkbatch_dagster")
    assert "dagster" in _loaded_after("import sparkbatch_dagster; sparkbatch_dagster.BatchInferenceComponent")
    assert "dagster" in _loaded_after("from sparkbatch_dagster import VLLMResource")


def test_a_run_imports_no_scikit_learn_and_no_pyplot():
    """The analytics asset calibrates and draws with numpy and a bare matplotlib Figure: scikit-learn
    (about 2 s to import) is the tests' oracle only (tests/unit/test_folds_oracle.py)."""
    mods = _modules_after("import sparkbatch_dagster.estimate.gold_fit, sparkbatch_dagster.estimate.cascades\n"
                          "import numpy as np\n"
                          "from sparkbatch_dagster.estimate.calibration import calibrate\n"
                          "rng = np.random.default_rng(0); c = rng.random(200)\n"
                          "calibrate(c, rng.random(200) < c, 'm', ['a', 'b'])\n"
                          "from sparkbatch_dagster.estimate.chart import new_figure, save_png\n"
                          "import tempfile, pathlib\n"
                          "save_png(new_figure(2, 2), pathlib.Path(tempfile.mkdtemp()) / 'c.png')")
    assert not {m for m in mods if m.split(".")[0] in ("sklearn", "scipy")}
    assert "matplotlib.figure" in mods and "matplotlib.pyplot" not in mods
