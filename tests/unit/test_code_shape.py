"""benchmarks/tools/code_shape.py counts what issue 50's note reports: checked on a tiny planted package."""

from __future__ import annotations

from pathlib import Path

from benchmarks.tools import code_shape

ROOT = Path(__file__).resolve().parents[2]

FILES = {
    "__init__.py": "",
    "engines/__init__.py": '"""Engines."""\nfrom .a import A\n',
    "engines/a.py": "from .sub import b\n\nclass A:\n    max_num_seqs = 8\n",
    "engines/sub/__init__.py": "",
    "engines/sub/b.py": "def lazy():\n    from ..c import x\n    return x\n",
    "engines/c.py": "from ..errors import Oops\n\nx = 1  # label_decoding\n",
    "errors.py": "class Oops(Exception):\n    pass\n",
    "run/__init__.py": "",
    "run/r.py": (
        "from typing import Any\n"
        "from ..engines import c\n"
        "\n"
        "def f() -> dict[str, Any]:\n"
        "    return {}\n"
        "\n"
        "def g() -> 'dict[str, Any]':\n"
        "    return {'cost_usd': 1}\n"
        "\n"
        "def h() -> dict[str, Any] | None:\n"
        "    return None\n"
        "\n"
        "def generate(d):\n"
        "    a = d['cost_usd']\n"
        "    b = d[\"cost_usd\"]\n"
        "    return a + b + c.x\n"
        "\n"
        "class E:\n"
        "    def generate(self):\n"
        "        return 'cost_usd'\n"
    ),
}


def _plant(tmp_path: Path) -> Path:
    package = tmp_path / "pkg"
    for rel, text in FILES.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    return package


def test_code_shape_counts_the_planted_package(tmp_path):
    package = _plant(tmp_path)
    got = code_shape.shape(package)
    # a.py, c.py, sub/b.py; arrows __init__ -> a -> sub.b -> c (lazy): c -> errors and r -> c are not inside engines
    assert (got["engines_modules"], got["engines_subpackages"]) == (3, ["sub"])
    assert (got["engines_import_arrows"], got["engines_floors"]) == (3, 4)
    assert got["options"] == {"max_num_seqs": {"files": 1, "paths": ["engines/a.py"]},
                              "label_decoding": {"files": 1, "paths": ["engines/c.py"]},
                              "server_token_ids": {"files": 0, "paths": []}}
    assert got["dict_str_any"] == ["run/r.py:4 f", "run/r.py:7 g"]
    assert (got["dict_str_any_functions"], got["dict_str_any_in_return_annotation"]) == (2, 3)
    assert got["longest_generate"] == {"lines": 4, "file": "run/r.py"}
    assert (got["cost_usd_indexes"], got["cost_usd_indexes_text"]) == (2, 1)
    assert got["modules"] == len(FILES)
    assert got["largest_module"] == {"lines": 20, "file": "run/r.py"}


def test_floors_walk_a_cycle_once():
    assert code_shape._floors({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == 3
    assert code_shape._floors({}) == 0
