"""Fixtures of the distributed tests: tiny record-only shards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dist_helpers import RECORDS, write_records


@pytest.fixture(scope="session")
def records_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_records(tmp_path_factory.mktemp("dist-records"), RECORDS)
