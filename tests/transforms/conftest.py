"""Fixtures for the transforms tests: the TF fixture's records and pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed.format.example import decode_example
from shardfeed.format.framing import scan, unframe_bytes


@pytest.fixture(scope="session")
def tf_records(tf_fixtures: Path) -> list[dict[str, Any]]:
    """Decoded records of mixed.tfrecord, through the format layer's own codec."""
    data = (tf_fixtures / "mixed.tfrecord").read_bytes()
    offsets = scan(tf_fixtures / "mixed.tfrecord")
    return [
        decode_example(unframe_bytes(data[a:b], path="mixed.tfrecord", record=i, offset=int(a)))
        for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist()))
    ]


@pytest.fixture(scope="session")
def tf_expected(tf_fixtures: Path) -> dict[str, Any]:
    return json.loads((tf_fixtures / "expected.json").read_text())


@pytest.fixture(scope="session")
def tf_pixels(tf_fixtures: Path) -> dict[str, np.ndarray]:
    with np.load(tf_fixtures / "mixed-pixels.npz") as data:
        return {k: data[k] for k in data.files}
