"""Benchmarks, tools and machine runners of sparkbatch-dagster: run as ``python -m benchmarks.<area>.<name>``
from the repository root (benchmarks/README.md has the map)."""
