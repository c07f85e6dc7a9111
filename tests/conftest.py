"""Fixtures shared by the whole suite."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TF_FIXTURES = TESTS / "data" / "tf"


@pytest.fixture(scope="session")
def tf_fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TFRecord files written by real TensorFlow 2.21 (see tests/data/tf/README.md).

    A fresh copy per test session, so that nothing a test does (an index built beside a file,
    say) can change the originals.
    """
    copy = tmp_path_factory.mktemp("tf-fixtures") / "tf"
    shutil.copytree(TF_FIXTURES, copy)
    return copy
