"""Fixtures of the pipeline tests: tiny real shards of real JPEGs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import open_dataset, write_dataset


@pytest.fixture(scope="session")
def clean_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("clean"), 103)


@pytest.fixture()
def clean_ds(clean_folder: Path) -> Any:
    return open_dataset(clean_folder)


@pytest.fixture(scope="session")
def bad_jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("badjpeg"), 60, bad_jpeg=(41,))


@pytest.fixture(scope="session")
def bad_crc_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("badcrc"), 60, bad_crc=(25,))
