"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TF_FIXTURES = TESTS / "data" / "tf"


@pytest.fixture(scope="session")
def tf_fixtures() -> Path:
    """TFRecord files written by real TensorFlow 2.21 (a copy of shared/fixtures/tf)."""
    return TF_FIXTURES
