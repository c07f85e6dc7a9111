"""The fast paths a data source declares (``shardfeed.ReadsColumns``): a source written from
docs/extending.md that reads columns gets the batch path (one call a slice, no dict a
record), the same bytes as sample by sample, and is seen by ``isinstance``, not by name."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import shardfeed
from shardfeed.transforms import Normalize


class Arrays(shardfeed.DataSourceBase):
    """Images and labels held in memory (docs/extending.md's example)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels
        self.lock = threading.Lock()
        self.records_read = 0

    def __len__(self) -> int:
        return len(self.images)

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        with self.lock:
            self.records_read += len(indices)
        return [{"image": self.images[i], "label": self.labels[i]} for i in indices]

    @property
    def fingerprint(self) -> str:
        return f"arrays:{len(self.images)}"


class ArrayColumns(Arrays):
    """The same, declaring the column read: one array a feature for many records."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        super().__init__(images, labels)
        self.column_reads = 0

    def read_columns(self, indices: Sequence[int] | np.ndarray, *,
                     into: Any = None) -> dict[str, Any] | None:
        with self.lock:
            self.column_reads += 1
        idx = np.asarray(indices, dtype=np.int64)
        return {"image": self.images[idx], "label": self.labels[idx]}


def _data(n: int = 600) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8),
            rng.integers(0, 10, n).astype(np.int64))


def _batches(source: Any, transform: Any = None) -> list[dict[str, np.ndarray]]:
    with shardfeed.Loader(source, batch_size=64, seed=4, num_threads=2,
                          transform=transform) as loader:
        return [{k: np.array(v) for k, v in b.items()} for e in range(2)
                for b in (loader.set_epoch(e), list(loader))[1]]


def test_the_declared_capability_is_seen_by_isinstance() -> None:
    images, labels = _data(8)
    assert isinstance(ArrayColumns(images, labels), shardfeed.ReadsColumns)
    assert not isinstance(Arrays(images, labels), shardfeed.ReadsColumns)
    assert not isinstance(Arrays(images, labels), shardfeed.ReadsAhead)


@pytest.mark.parametrize("transform", [None, Normalize(mean=0.5, std=0.25)],
                         ids=["no transform", "batch-form transform"])
def test_a_source_that_reads_columns_takes_the_batch_path_with_the_same_bytes(
        transform: Any) -> None:
    images, labels = _data()
    columns = ArrayColumns(images, labels)
    got = _batches(columns, transform)
    # the batch path: one column read a slice, records read one by one only for the
    # layout's probe (a record or two), never for the 1,200 samples
    assert columns.column_reads >= 2 * 600 // 64
    assert columns.records_read <= 2
    plain = Arrays(images, labels)
    want = _batches(plain, transform)
    assert plain.records_read >= 1200
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_columns_that_do_not_fit_fall_back_to_records() -> None:
    images, labels = _data(256)

    class Ragged(ArrayColumns):
        def read_columns(self, indices: Sequence[int] | np.ndarray, *,
                         into: Any = None) -> dict[str, Any] | None:
            super().read_columns(indices)
            return None  # "these records are not alike"

    ragged = Ragged(images, labels)
    got = _batches(ragged)
    assert ragged.column_reads >= 1 and ragged.records_read >= 512
    want = _batches(Arrays(images, labels))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a["image"], b["image"])
