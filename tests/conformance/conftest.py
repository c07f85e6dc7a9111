"""Fixtures of the stage conformance tests (the pipeline helpers build the shards)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_helpers import write_dataset


@pytest.fixture(scope="session")
def conformance_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("conformance"), 57, shards=2)
