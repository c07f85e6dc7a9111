"""A FeatureSpec with a fixed shape and a default is tf.io.FixedLenFeature end to end: where
records lack the feature the batch is still one dense (B, 9) array (the layout reports an
array field, which the tf.data road turns into a dense tensor), and a record of another count
stops the loader naming its shard, record and byte offset."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from shardfeed.dataset import Dataset
from shardfeed.errors import SchemaError
from shardfeed.format.example import FeatureSpec
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader

RECORDS = 12


def has_vec(i: int) -> bool:
    return i % 3 != 0  # records 0, 3, 6, 9 lack it: the first sample too


def vec(i: int) -> np.ndarray:
    return np.arange(9, dtype=np.float32) + 10 * i


def write_records(folder: Path, *, short: int | None = None) -> Path:
    """Two shards; ``short``: that record's ``vec`` holds 8 values."""
    folder.mkdir()
    for shard, ids in enumerate((range(7), range(7, RECORDS))):
        with ShardWriter(str(folder / f"part-{shard}.tfrecord")) as writer:
            for i in ids:
                features: dict[str, object] = {"image/filename": f"{i:03d}.jpg",
                                               "image/class/label": [i % 4]}
                if has_vec(i):
                    features["vec"] = vec(i)[:8] if i == short else vec(i)
                writer.write_example(features)
    return folder


SPEC = {"vec": FeatureSpec("float", shape=(9,), default=-1.0),
        "image/class/label": FeatureSpec("int64", shape=())}


def test_missing_features_batch_densely(tmp_path: Path) -> None:
    ds = Dataset(write_records(tmp_path / "d"), features=SPEC)
    assert ds.schema.features["vec"].length == 9  # stored: missing in some records
    with Loader(ds, batch_size=4, transform=None, shuffle=False) as loader:
        layout, _ = loader.batch_layout()
        field = {f.name: f for f in layout.fields}["vec"]
        assert field.is_array and field.shape == (9,) and np.dtype(field.dtype) == np.float32
        batches = list(loader)
    rows = np.concatenate([b["vec"] for b in batches])
    for b in batches:
        assert isinstance(b["vec"], np.ndarray)
        assert b["vec"].shape == (4, 9) and b["vec"].dtype == np.float32
        assert b["image/class/label"].shape == (4,)
    for i in range(RECORDS):
        want = vec(i) if has_vec(i) else np.full(9, -1.0, np.float32)
        np.testing.assert_array_equal(rows[i], want)


def test_a_list_default_is_reshaped(tmp_path: Path) -> None:
    spec = {"vec": FeatureSpec("float", shape=(3, 3), default=list(range(9))),
            "image/class/label": FeatureSpec("int64", shape=())}
    ds = Dataset(write_records(tmp_path / "d"), features=spec)
    with Loader(ds, batch_size=6, transform=None, shuffle=False) as loader:
        batch = next(iter(loader))
    assert batch["vec"].shape == (6, 3, 3) and batch["vec"].dtype == np.float32
    np.testing.assert_array_equal(batch["vec"][0], np.arange(9).reshape(3, 3))
    np.testing.assert_array_equal(batch["vec"][1], vec(1).reshape(3, 3))


def test_a_record_of_another_count_names_shard_record_and_offset(tmp_path: Path) -> None:
    ds = Dataset(write_records(tmp_path / "d", short=8), features=SPEC)
    with Loader(ds, batch_size=4, transform=None, shuffle=False) as loader, \
            pytest.raises(SchemaError) as caught:
        list(loader)
    message = str(caught.value)
    assert re.search(r"part-1\.tfrecord', record 1 at byte \d+", message), message
    assert "feature 'vec' has 8 values but the spec shape (9,) needs 9" in message
