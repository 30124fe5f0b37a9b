"""The one Definitions object of this deployment (loaded by workspace.yaml, ``dg`` and the CLI):
every job declared as a folder with a defs.yaml under ``assets/defs/`` (``[tool.dg]`` in
pyproject.toml), plus the Python asset that writes the demo's input."""

from pathlib import Path

from dagster import Definitions, load_from_defs_folder

from assets import debian_packages

defs = Definitions.merge(
    load_from_defs_folder(path_within_project=Path(__file__).resolve().parent),
    Definitions(assets=[debian_packages]),
)
