"""Batches the caller keeps stay what they were, and a plain loop still reuses the buffers.

Each test does what a user migrating from torch's DataLoader or tf.data does: keep the batches
in a list, append the labels of each batch in an evaluation loop, keep views of single images.
The reference is the same stream with every batch copied the moment it is handed out.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, record_ids, train_transform

from shardfeed.loaders import numpy as np_adapter
from shardfeed.pipeline import Loader

WORKERS = ["threads", "processes"]
SIZE = 96  # 8 images of 96x96x3 are more than the 64 KiB a batch that small columns may be


def options(workers: str = "threads", **extra: Any) -> dict[str, Any]:
    made: dict[str, Any] = {"batch_size": 8, "seed": 4, "transform": train_transform(SIZE),
                            "num_threads": 2, "prefetch_batches": 2, "workers": workers}
    made.update(extra)
    return made


def copied_batches(folder: Path, **loader_options: Any) -> list[dict[str, Any]]:
    """The stream with each batch copied as soon as it is handed out (threads: same bytes)."""
    loader_options = {**loader_options, "workers": "threads"}
    with Loader(open_dataset(folder), **loader_options) as loader:
        return [{k: v.copy() if isinstance(v, np.ndarray) else list(v) for k, v in b.items()}
                for b in loader]


def assert_same_batches(kept: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(kept) == len(expected)
    for k, (got, want) in enumerate(zip(kept, expected)):
        assert list(got) == list(want)
        for name, value in want.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(np.asarray(got[name]), value,
                                              err_msg=f"batch {k}, {name!r}")
            else:
                assert list(got[name]) == value, f"batch {k}, {name!r}"


@pytest.mark.parametrize("workers", WORKERS)
def test_list_of_a_loader_keeps_every_batch(clean_folder: Path, workers: str) -> None:
    with Loader(open_dataset(clean_folder), **options(workers)) as loader:
        kept = list(loader)
        again = list(loader)  # the next epoch: the first one's batches must not change
    expected = copied_batches(clean_folder, **options())
    assert len(kept) == 13  # 103 records, batches of 8, last one partial
    assert_same_batches(kept, expected)
    assert sorted(record_ids(kept)) == list(range(103))  # every record once across the list
    assert sorted(record_ids(again)) == list(range(103))
    assert record_ids(again) != record_ids(kept)


@pytest.mark.parametrize("workers", WORKERS)
def test_eval_loop_appending_labels_and_views(clean_folder: Path, workers: str) -> None:
    labels, indices, first_images, rows = [], [], [], []
    with Loader.for_eval(open_dataset(clean_folder), **options(workers)) as loader:
        for batch in loader:
            labels.append(batch["image/class/label"])
            indices.append(batch["index"])
            first_images.append(batch["image"][0])       # a view of one image
            rows.extend(batch["labels"])                 # views of single rows
    assert np.concatenate(indices).tolist() == list(range(103))
    assert np.concatenate(labels).tolist() == [i % 5 for i in range(103)]
    expected = copied_batches(clean_folder, **options(shuffle=False, drop_last=False))
    for k, image in enumerate(first_images):
        np.testing.assert_array_equal(image, expected[k]["image"][0], err_msg=f"batch {k}")
    np.testing.assert_array_equal(np.stack(rows), np.concatenate([b["labels"] for b in expected]))


@pytest.mark.parametrize("workers", WORKERS)
def test_plain_loop_reuses_the_batch_buffers(clean_folder: Path, workers: str) -> None:
    """The training loop (each batch used and dropped) builds every batch in the ring."""
    addresses: set[int] = set()
    labels = []
    with Loader(open_dataset(clean_folder), **options(workers)) as loader:
        ring_batches = loader.memory_budget().ring_batches
        for _ in range(2):
            for batch in loader:
                assert batch["image"].shape[1:] == (SIZE, SIZE, 3)
                assert not batch["image"].flags.owndata  # the ring's memory, not a copy
                addresses.add(int(batch["image"].__array_interface__["data"][0]))
                labels.append(batch["image/class/label"])  # small columns may be kept freely
    assert len(labels) == 26
    assert len(addresses) <= ring_batches


def _keep_last(loader: Loader, held: int, epochs: int) -> tuple[set[int], list[Any]]:
    """Iterate ``epochs`` epochs keeping the last ``held`` batches alive (a prefetch buffer
    of a framework holding the loader's memory); the image addresses seen, every batch copied
    as it came, and the batches still held at the end checked against those copies."""
    addresses: set[int] = set()
    window: list[tuple[dict[str, Any], dict[str, Any]]] = []
    copies: list[dict[str, Any]] = []
    for _ in range(epochs):
        for batch in loader:
            addresses.add(int(batch["image"].__array_interface__["data"][0]))
            copied = {k: v.copy() if isinstance(v, np.ndarray) else list(v)
                      for k, v in batch.items()}
            copies.append(copied)
            window = [*window, (batch, copied)][-held:]
            for kept, want in window:  # nothing held was written into
                np.testing.assert_array_equal(kept["image"], want["image"])
    return addresses, copies


def test_a_consumer_that_holds_batches_has_them_built_in_the_ring(clean_folder: Path) -> None:
    """A consumer keeping 3 batches alive (tf.data's prefetch over tensors made without a
    copy) that says so: the ring grows once and builds in the same buffers every epoch."""
    with Loader(open_dataset(clean_folder), **options(drop_last=True)) as loader:
        loader.reserve_held_batches(3)
        ring_batches = loader.memory_budget().ring_batches
        addresses, copies = _keep_last(loader, held=3, epochs=3)
    assert ring_batches == 2 + 1 + 3  # built ahead, the one in hand, the 3 held
    assert len(copies) == 36
    assert len(addresses) <= ring_batches
    expected = copied_batches(clean_folder, **options(drop_last=True))
    assert_same_batches(copies[:12], expected)


def test_a_consumer_that_holds_batches_unsaid_gets_new_memory(clean_folder: Path) -> None:
    """The same consumer without reserve_held_batches still gets intact batches, each built in
    new memory once the ring's buffers are all held."""
    with Loader(open_dataset(clean_folder), **options(drop_last=True)) as loader:
        addresses, copies = _keep_last(loader, held=3, epochs=3)
    assert len(copies) == 36
    assert len(addresses) > 2 + 1 + 3


def test_reserve_held_batches_rejects_what_is_not_a_count(clean_folder: Path) -> None:
    with Loader(open_dataset(clean_folder), **options()) as loader:
        for bad in (-1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="held must be an int >= 0"):
                loader.reserve_held_batches(bad)  # type: ignore[arg-type]


def test_numpy_adapter_copy_is_no_longer_needed(clean_folder: Path) -> None:
    with Loader(open_dataset(clean_folder), **options()) as loader:
        with pytest.warns(DeprecationWarning, match="copy=True is no longer needed"):
            adapted = np_adapter.adapt(loader, copy=True)
        kept = list(adapted)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plain = list(np_adapter.adapt(loader))
    assert_same_batches(kept, copied_batches(clean_folder, **options()))
    assert sorted(record_ids(plain)) == list(range(103))


def test_loader_copy_option_is_deprecated(clean_folder: Path) -> None:
    with pytest.warns(DeprecationWarning, match="copy=True is no longer needed"):
        loader = Loader(open_dataset(clean_folder), copy=True, **options())
    with loader:
        kept = list(loader)
    assert_same_batches(kept, copied_batches(clean_folder, **options()))
