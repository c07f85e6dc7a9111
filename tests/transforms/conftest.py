"""Fixtures for the transforms tests: the TF fixture's records and pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transforms_helpers import parse_example, read_records


@pytest.fixture(scope="session")
def tf_records(tf_fixtures: Path) -> list[dict[str, Any]]:
    """Decoded records of mixed.tfrecord (as the Example codec would give them)."""
    return [parse_example(p) for _off, p in read_records(tf_fixtures / "mixed.tfrecord")]


@pytest.fixture(scope="session")
def tf_expected(tf_fixtures: Path) -> dict[str, Any]:
    return json.loads((tf_fixtures / "expected.json").read_text())


@pytest.fixture(scope="session")
def tf_pixels(tf_fixtures: Path) -> dict[str, np.ndarray]:
    with np.load(tf_fixtures / "mixed-pixels.npz") as data:
        return {k: data[k] for k in data.files}
