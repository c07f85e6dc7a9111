"""Fixtures for the dataset tests: copies of TensorFlow's files and small packed datasets."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed.format.manifest import Manifest, save_sidecars
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema
from shardfeed.format.writer import ShardWriter


@pytest.fixture(scope="session")
def tf_expected(tf_fixtures: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tf_fixtures / "expected.json").read_text())
    return data


@pytest.fixture
def tf_copy(tf_fixtures: Path, tmp_path: Path) -> Path:
    """A folder holding copies of mixed.tfrecord and second.tfrecord (no indexes yet)."""
    folder = tmp_path / "tf"
    folder.mkdir()
    for name in ("mixed.tfrecord", "second.tfrecord"):
        shutil.copy(tf_fixtures / name, folder / name)
    return folder


@pytest.fixture
def expected_filenames(tf_expected: dict[str, Any]) -> list[str]:
    """image/filename of every record of mixed.tfrecord then second.tfrecord."""
    recs = tf_expected["records"] + tf_expected["second"]
    return [r["features"]["image/filename"]["values"][0]["utf8"] for r in recs]


@pytest.fixture
def make_packed(tmp_path: Path) -> Callable[..., Path]:
    """Write a packed dataset: ``shards`` shards of ``per_shard`` records, with manifest and
    group/order sidecars. Record i holds label i, day i // 4, timestamp 8 * i, and
    ``payload_bytes`` bytes of image."""

    def _make(shards: int = 3, per_shard: int = 5, payload_bytes: int = 100,
              name: str = "packed") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        infos = []
        i = 0
        for s in range(shards):
            with ShardWriter(folder / f"train-{s:05d}.tfrecord") as writer:
                for _ in range(per_shard):
                    writer.write_example({
                        "image/encoded": bytes([i % 256]) * payload_bytes,
                        "image/class/label": i,
                        "day": i // 4,
                        "timestamp": 8.0 * i,
                    })
                    i += 1
            infos.append(writer.close())
        n = shards * per_shard
        schema = Schema(
            features={
                "image/encoded": FeatureInfo("image/encoded", "bytes", 1),
                "image/class/label": FeatureInfo("image/class/label", "int64", 1),
                "day": FeatureInfo("day", "int64", 1),
                "timestamp": FeatureInfo("timestamp", "float", 1),
            },
            image=ImageInfo("image/encoded", "jpeg"),
            label_key="image/class/label",
        )
        Manifest(shards=infos, schema=schema, mode="referenced", root="images",
                 group_key="day", order_key="timestamp").save(folder / "shardfeed.json")
        save_sidecars(folder, group_ids=np.arange(n) // 4, order_keys=8.0 * np.arange(n))
        return folder

    return _make

