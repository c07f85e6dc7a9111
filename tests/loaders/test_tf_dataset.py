"""tf.data from a Loader (shardfeed.tf): the element spec from the batch layout, the loader's
epochs, no batch lost to prefetching, and exact resume through tf.train.Checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow")

from pipeline_helpers import open_dataset, train_transform, write_dataset

from shardfeed.loaders import tensorflow as sf_tf
from shardfeed.pipeline import Loader


def _loader(folder: Path, **options: Any) -> Loader:
    options.setdefault("num_threads", 2)
    return Loader(open_dataset(folder), batch_size=8, seed=1, transform=train_transform(),
                  **options)


def _ids(ds: Any) -> list[list[int]]:
    return [b["index"].numpy().tolist() for b in ds]


def test_element_spec_from_the_layout_before_any_batch(adapter_folder: Path) -> None:
    with _loader(adapter_folder, drop_last=True) as loader:
        ds = sf_tf.dataset(loader)
        spec = ds.element_spec
        assert spec["image"].shape == (8, 32, 32, 3) and spec["image"].dtype == tf.uint8
        assert spec["labels"].shape == (8, 3) and spec["labels"].dtype == tf.float32
        assert spec["image/class/label"].shape == (8,)
        assert spec["image/filename"].dtype == tf.string
        assert loader.state()["consumed"] == 0  # no batch was taken to learn it
        batch = next(iter(ds))
        assert batch["image/filename"].numpy()[0].startswith(b"img")
    with _loader(adapter_folder) as loader:  # the last batch is partial: batch axis None
        assert sf_tf.element_spec(loader, features=["image"])["image"].shape == (None, 32, 32, 3)
        with pytest.raises(ValueError, match="nope"):
            sf_tf.dataset(loader, features=["image", "nope"])


def test_each_iteration_is_the_loaders_next_epoch(adapter_folder: Path) -> None:
    with _loader(adapter_folder) as reference:
        expected = [[b["index"].tolist() for b in reference] for _ in range(2)]
    with _loader(adapter_folder) as loader:
        ds = sf_tf.dataset(loader, prefetch=3)
        assert [_ids(ds), _ids(ds)] == expected and loader.epoch == 2
        loader.set_epoch(1)
        assert _ids(ds) == expected[1]
        images = next(iter(ds))["image"].numpy()
    with _loader(adapter_folder) as plain:
        plain.set_epoch(2)
        np.testing.assert_array_equal(images, next(iter(plain))["image"])


def test_tensors_kept_across_epochs_stay_what_they_were(adapter_folder: Path) -> None:
    """tf.data holds the loader's memory (tensors made without a copy): the ring grows by the
    prefetch and the batches in hand, never writes into a tensor still alive, and the loader's
    memory bound counts them."""
    with _loader(adapter_folder, drop_last=True) as reference:
        expected = [b["image"].copy() for _ in range(3) for b in reference]
    with _loader(adapter_folder, drop_last=True) as loader:
        ds = sf_tf.dataset(loader, prefetch=3)
        kept = [b["image"] for _ in range(3) for b in ds]  # every tensor of 3 epochs alive
        assert loader.memory_budget().ring_batches == loader.options.prefetch_batches + 1 + 5
    assert len(kept) == len(expected)
    for k, (tensor, want) in enumerate(zip(kept, expected)):
        np.testing.assert_array_equal(tensor.numpy(), want, err_msg=f"batch {k}")


def test_the_dataset_is_not_autotuned(adapter_folder: Path) -> None:
    """Nothing in it is tunable, and with autotuning on, tf.data's iterator waited in its
    teardown for the tuner (0.2-2.6 s at the end of a third of the epochs, measured)."""
    with _loader(adapter_folder) as loader:
        assert sf_tf.dataset(loader).options().autotune.enabled is False


def test_batches_prefetched_but_not_taken_are_not_lost(adapter_folder: Path) -> None:
    with _loader(adapter_folder) as reference:
        expected = [b["index"].tolist() for b in reference]
    with _loader(adapter_folder) as loader:
        ds = sf_tf.dataset(loader, prefetch=3)
        first = next(iter(ds))["index"].numpy().tolist()  # the iterator and its buffer dropped
        assert [first, *_ids(ds)] == expected


def test_a_pass_left_early_with_blocks_in_flight_loses_nothing(tmp_path: Path) -> None:
    # small batches go over in blocks of 16: a pass left after one batch (``take``, Keras's
    # steps_per_epoch) has blocks in the consumer's hands, in the prefetch buffer and in the
    # making; the next pass goes on right after the batch taken
    folder = write_dataset(tmp_path / "small", 160, shards=2)

    def loader() -> Loader:
        return Loader(open_dataset(folder), batch_size=2, seed=3, num_threads=2,
                      transform=train_transform(8), drop_last=True)

    with loader() as reference:
        expected = [b["index"].tolist() for b in reference]
    with loader() as made:
        ds = sf_tf.dataset(made, features=["index"])
        taken = [b["index"].numpy().tolist() for b in ds.take(1)]
        taken += [b["index"].numpy().tolist() for b in ds.take(3)]
        assert taken + _ids(ds) == expected and len(expected) == 80


def test_checkpoint_mid_epoch_resumes_the_identical_stream(adapter_folder: Path,
                                                           tmp_path: Path) -> None:
    with _loader(adapter_folder) as loader:
        ds = sf_tf.dataset(loader, prefetch=2)
        checkpoint = tf.train.Checkpoint(step=tf.Variable(0), data=sf_tf.LoaderState(loader))
        iterator = iter(ds)
        for _ in range(2):
            next(iterator)
            checkpoint.step.assign_add(1)
        path = checkpoint.save(str(tmp_path / "ckpt"))
        rest = [b["index"].numpy().tolist() for b in iterator] + _ids(ds)
    with _loader(adapter_folder, num_threads=1) as again:
        ds = sf_tf.dataset(again)
        restored = tf.train.Checkpoint(step=tf.Variable(0), data=sf_tf.LoaderState(again))
        restored.restore(path)
        assert int(restored.step) == 2
        assert _ids(ds) + _ids(ds) == rest
    with Loader(open_dataset(adapter_folder), batch_size=8, seed=2) as other, \
            pytest.raises(Exception, match="seed"):
        tf.train.Checkpoint(data=sf_tf.LoaderState(other)).restore(path)


def test_the_epoch_length_is_known_on_every_road(adapter_folder: Path) -> None:
    # Keras reads the cardinality as the epoch's steps: with a device prefetch too
    with _loader(adapter_folder) as reference:
        expected = [b["index"].tolist() for b in reference]
    for options in ({}, {"prefetch": 0}, {"device": "/cpu:0"}):
        with _loader(adapter_folder) as loader:
            ds = sf_tf.dataset(loader, **options)
            assert int(ds.cardinality()) == len(loader) == 4
            assert _ids(ds) == expected


def test_features_of_varying_length_are_ragged_tensors(tmp_path: Path) -> None:
    from shardfeed.dataset import Dataset
    from shardfeed.format.writer import ShardWriter
    from shardfeed.tools.index import index_files

    folder = tmp_path / "ragged"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(21):
            writer.write_example({"ids": list(range(i % 4 + 1)), "name": f"n{i}".encode(),
                                  "tags": [b"x"] * (i % 3 + 1)})
    index_files(str(folder))

    def loader() -> Loader:
        return Loader(Dataset(str(folder)), batch_size=4, shuffle=True, seed=0, transform=None)

    with loader() as reference:
        expected = list(reference)
    with loader() as bridged:
        ds = sf_tf.dataset(bridged)
        assert isinstance(ds.element_spec["ids"], tf.RaggedTensorSpec)
        assert isinstance(ds.element_spec["tags"], tf.RaggedTensorSpec)
        assert int(ds.cardinality()) == 6
        got = list(ds)
    assert len(got) == len(expected) == 6
    def rows(column: Any) -> list[list[Any]]:  # a record of one value may be a scalar
        return [np.atleast_1d(np.asarray(v, dtype=object)).tolist() for v in column]

    for batch, want in zip(got, expected, strict=True):
        assert batch["ids"].to_list() == rows(want["ids"])
        assert batch["tags"].to_list() == rows(want["tags"])
        assert batch["name"].numpy().tolist() == want["name"]
