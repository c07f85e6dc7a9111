"""The fuzz target's run length: ``--fuzz-inputs N`` (the option is defined in
tests/conftest.py, where pytest looks for options)."""

from __future__ import annotations

import pytest
from fuzz_run import DEFAULT_INPUTS

SECONDS_AN_INPUT = 0.05
"""Time allowed an input on average when the run's time limit is set (they take ~3 ms)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a long run on demand gets a time limit to match instead of the suite's default one
    inputs = config.getoption("--fuzz-inputs") or DEFAULT_INPUTS
    limit = 120 + inputs * SECONDS_AN_INPUT
    for item in items:
        if item.path.parent.name == "fuzz" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))
