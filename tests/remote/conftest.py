"""Fixtures of the remote tests: the moto S3 server and the stalled endpoint of tests/storage,
and tiny datasets."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_TESTS / "storage"))
sys.path.insert(0, str(_TESTS / "distributed"))

from dist_helpers import write_records
from s3_fixture import S3Server
from stalled_server import StalledServer, stalled_server

from shardfeed.tools.index import index_files

__all__ = ["S3Server", "StalledServer", "records_dataset", "stalled_server"]


@pytest.fixture(scope="session")
def records_dataset(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, int], Path]:
    """``make(n, shards)``: a local dataset folder (shards, indexes, manifest), made once."""
    made: dict[tuple[int, int], Path] = {}

    def make(n: int, shards: int) -> Path:
        if (n, shards) not in made:
            folder = write_records(tmp_path_factory.mktemp(f"records-{n}-{shards}") / "ds", n,
                                   shards=shards)
            index_files(str(folder))
            made[n, shards] = folder
        return made[n, shards]

    return make
