"""The package's Dagster names load on first use (``sparkbatch_dagster/__init__.py``, PEP 562): every
public name still imports from the package, and ``dg`` still finds the component the way it looks
(``dir()`` and ``getattr`` on the registry module). That the package alone loads no Dagster is
tests/e2e/test_lazy_imports.py's (a fresh interpreter)."""

from __future__ import annotations

from pathlib import Path

import tomllib

import sparkbatch_dagster

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_imports_from_the_package_and_dg_finds_the_component(monkeypatch) -> None:
    from dagster.components.core.package_entry import get_package_objects_in_module
    from dagster_shared.seven import load_module_object

    from sparkbatch_dagster.definitions.component import BatchInferenceComponent
    from sparkbatch_dagster.definitions.factory import BatchJob, build_batch_assets
    from sparkbatch_dagster.definitions.resource import VLLMResource

    where = {"BatchInferenceComponent": BatchInferenceComponent, "BatchJob": BatchJob,
             "build_batch_assets": build_batch_assets, "VLLMResource": VLLMResource}
    for name in where:  # as if never looked up: the next lookup goes through the module's __getattr__
        monkeypatch.delitem(sparkbatch_dagster.__dict__, name, raising=False)
    assert set(where) <= set(dir(sparkbatch_dagster))
    found = dict(get_package_objects_in_module(sparkbatch_dagster))  # dg's own discovery
    assert found == {"BatchInferenceComponent": BatchInferenceComponent}
    # What a defs.yaml's `type: sparkbatch_dagster.BatchInferenceComponent` resolves through.
    assert load_module_object("sparkbatch_dagster", "BatchInferenceComponent") is BatchInferenceComponent
    namespace: dict[str, object] = {}
    exec("from sparkbatch_dagster import *", namespace)  # noqa: S102 - every name in __all__, the lazy ones too
    assert set(sparkbatch_dagster.__all__) <= set(namespace)
    for name, value in where.items():
        assert namespace[name] is value
    try:
        sparkbatch_dagster.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
    # dg looks in the module the entry point names: this package itself.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["dagster_dg_cli.registry_modules"] == {"sparkbatch_dagster": "sparkbatch_dagster"}
