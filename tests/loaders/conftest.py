"""Fixtures of the adapter tests (the pipeline helpers build the shards)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from pipeline_helpers import open_dataset, train_transform, write_dataset

from shardfeed.pipeline import Loader


@pytest.fixture(scope="session")
def adapter_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("adapters"), 30, shards=2)


@pytest.fixture()
def loader(adapter_folder: Path) -> Any:
    with Loader(open_dataset(adapter_folder), batch_size=8, seed=1, transform=train_transform(),
                num_threads=2) as made:
        yield made


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "tensorflow: needs TensorFlow (the 'tensorflow' extra); skipped without it"
    )
