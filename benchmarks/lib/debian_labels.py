"""The label job the labels/ benchmarks share: Debian package descriptions sorted into sections
whose first tokens tell them apart, and the options of a one-engine run over them."""

from __future__ import annotations

import argparse

from benchmarks.lib.workload import DEBIAN

#: The 13 most common sections of the Debian set (libs, libdevel, ... java); those whose first
#: tokens begin another section (libs / libdevel, java / javascript) are left out.
SECTIONS = ["python", "doc", "perl", "devel", "utils", "haskell", "net", "rust", "golang", "java"]


def rows(n: int) -> list[dict[str, str]]:
    """``n`` packages of those sections (a fixed sample): package, description (its first 400
    characters), section."""
    import duckdb

    listed = ", ".join(f"'{s}'" for s in SECTIONS)
    got = duckdb.sql(f"SELECT package, left(description, 400), section FROM read_parquet('{DEBIAN}') WHERE section IN "
                     f"({listed}) AND description IS NOT NULL USING SAMPLE {n} ROWS (reservoir, 11)").fetchall()
    return [{"package": p, "description": d, "section": s} for p, d, s in got]


def engine_arguments(description: str) -> argparse.ArgumentParser:
    """The options every one-engine benchmark here takes: rows, rounds, model, engine settings, out."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rows", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=None, help="a model folder (default: the embedded SmolLM2)")
    ap.add_argument("--engine-kwargs", default="{}", help="JSON, e.g. '{\"load_format\": \"dummy\"}'")
    ap.add_argument("--out")
    return ap
