"""Fixtures for the format tests: TensorFlow's expected reads and helpers to build files."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from shardfeed.format.framing import frame


@pytest.fixture(scope="session")
def tf_expected(tf_fixtures: Path) -> dict[str, Any]:
    """What TensorFlow read back from the fixture files (expected.json)."""
    data: dict[str, Any] = json.loads((tf_fixtures / "expected.json").read_text())
    return data


@pytest.fixture
def write_records(tmp_path: Path) -> Callable[[Sequence[bytes], str], Path]:
    """Write payloads as one framed TFRecord file under tmp_path; returns its path."""

    def _write(payloads: Sequence[bytes], name: str = "data.tfrecord") -> Path:
        path = tmp_path / name
        path.write_bytes(b"".join(frame(p) for p in payloads))
        return path

    return _write
