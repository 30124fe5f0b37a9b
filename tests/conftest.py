"""The suite's root: tiers by folder (support/tiers.py) and the fixtures every tier shares
(support/common_fixtures.py). Helpers a test imports live in support/ too (``from testkit import
make_spec``): ``pythonpath`` in pyproject.toml puts that folder on the path.

How to run one tier, one test or the last failures: docs/testing.md."""

# pytester: tests/unit/test_tiers.py runs pytest on made-up trees, in-process.
pytest_plugins = ["tiers", "common_fixtures", "pytester"]
