"""The Loader's hot path: images written straight into the batch, same bytes as the copy path,
error places still named, and pools released safely from their own threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, write_dataset

from shardfeed.errors import SchemaError
from shardfeed.pipeline import Loader
from shardfeed.pipeline.batching import BatchBuffer, BatchLayout
from shardfeed.pipeline.produce import SliceBuilder, in_place_keys
from shardfeed.pipeline.samplers import EpochContext, RecordSampler
from shardfeed.sampling.permutation import EpochOrder
from shardfeed.transforms import presets


class _Opaque:
    """The train preset without its output spec or ``out=`` support: the copy path."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        result: dict[str, Any] = self.inner(sample, rng)
        return result


def _batches(ds: Any, transform: Any, *, threads: int, epochs: int = 2) -> list[dict[str, Any]]:
    loader = Loader(ds, batch_size=16, shuffle=True, seed=7, transform=transform,
                    num_threads=threads)
    out: list[dict[str, Any]] = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.extend(loader)
    loader.close()
    return out


def test_in_place_batches_equal_the_copy_path(clean_ds: Any) -> None:
    preset = presets.train(size=24)
    bound = preset.bind(clean_ds.schema, root=None)
    direct = _batches(clean_ds, preset, threads=2)
    copied = _batches(clean_ds, _Opaque(bound), threads=1)
    assert len(direct) == len(copied) > 0
    for a, b in zip(direct, copied):
        assert a.keys() == b.keys()
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["image/class/label"], b["image/class/label"])
        assert a["image/filename"] == b["image/filename"]


def _builder_and_buffer(ds: Any, transform: Any) -> tuple[SliceBuilder, BatchBuffer, EpochContext]:
    source = RecordSampler(ds)
    builder = SliceBuilder(source, source.bind(transform), skip=False)
    ctx = EpochContext(0, 0, EpochOrder(len(ds), seed=0, epoch=0, shuffle=True), len(ds))
    sample, _ = builder.sample_at(ctx, 0)
    layout = BatchLayout.infer(sample, batch_size=8, lengths=source.feature_lengths())
    return builder, BatchBuffer(layout), ctx


def test_train_preset_writes_images_in_place(clean_ds: Any) -> None:
    builder, buffer, ctx = _builder_and_buffer(clean_ds, presets.train(size=20))
    assert builder.direct_keys(buffer.layout) == ("image",)
    slot_before = buffer.slot("image", 3).__array_interface__["data"][0]
    seen: list[Any] = []
    write = buffer.write

    def spy(row: int, sample: dict[str, Any], **kwargs: Any) -> None:
        seen.append((row, sample["image"], kwargs.get("written")))
        write(row, sample, **kwargs)

    buffer.write = spy  # type: ignore[method-assign,assignment]
    builder.build_samples(ctx, np.arange(8, dtype=np.int64), buffer, 0)  # sample by sample
    assert len(seen) == 8
    for row, image, written in seen:
        assert written is not None and image is written["image"]  # the transform wrote the row
        assert image.__array_interface__["data"][0] == buffer.slot("image", row).__array_interface__[
            "data"][0]
    assert buffer.slot("image", 3).__array_interface__["data"][0] == slot_before
    # The batch path (a slice at a time) writes the images into the batch rows as well.
    stored: list[Any] = []
    write_columns = buffer.write_columns

    def column_spy(first_row: int, columns: dict[str, Any], **kwargs: Any) -> None:
        stored.append((columns["image"], kwargs.get("written")))
        write_columns(first_row, columns, **kwargs)

    buffer.write_columns = column_spy  # type: ignore[method-assign]
    builder.build_slice(ctx, np.arange(8, dtype=np.int64), buffer, 0)
    ((image, written),) = stored
    assert written is not None and image is written["image"]
    assert image.__array_interface__["data"][0] == buffer.slot("image", 0).__array_interface__[
        "data"][0]


def test_no_in_place_writes_without_a_matching_spec(clean_ds: Any) -> None:
    bound = presets.train(size=20).bind(clean_ds.schema, root=None)
    builder, buffer, _ = _builder_and_buffer(clean_ds, _Opaque(bound))
    assert builder.direct_keys(buffer.layout) == ()
    # A spec of another size than the batch column: no in-place write either.
    other = presets.train(size=21).bind(clean_ds.schema, root=None)
    assert in_place_keys(builder.sampler, other, buffer.layout) == ()


def test_a_wrong_shape_still_names_the_record(clean_ds: Any) -> None:
    def varying(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        index = int(np.asarray(sample["index"]).reshape(-1)[0])
        sample["image"] = np.zeros((4, 4 + (index == 50), 3), np.uint8)
        return sample

    loader = Loader(clean_ds, batch_size=16, shuffle=False, transform=varying, num_threads=2)
    with pytest.raises(SchemaError, match=r"epoch position 50 .*record id 50.*part-001"):
        list(loader)
    loader.close()


def test_release_from_a_pool_thread_does_not_join_itself(clean_ds: Any) -> None:
    loader = Loader(clean_ds, batch_size=8, transform=presets.train(size=16), num_threads=2)
    next(iter(loader))
    executor = loader._executor
    assert executor is not None
    threads = list(executor._threads)  # the pool's own threads
    # What the garbage collector does when the last reference dies on a worker thread.
    executor.submit(loader._finalizer).result(timeout=30)
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    releasers = [t for t in threading.enumerate() if t.name == "shardfeed-release"]
    for thread in releasers:
        thread.join(timeout=30)
    loader.close()


def test_gc_on_a_worker_thread_leaves_no_unraisable_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc
    import sys

    ds = open_dataset(write_dataset(tmp_path / "d", 24, shards=1))
    errors: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", errors.append)
    go = threading.Event()

    def collect_on_worker(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        if int(np.asarray(sample["index"]).reshape(-1)[0]) >= 4:
            # The prefetched batch waits here until the loader is unreachable.
            go.wait(timeout=30)
            gc.collect()
        return {"label": np.asarray(sample["image/class/label"])}

    loader = Loader(ds, batch_size=4, shuffle=False, transform=collect_on_worker, num_threads=1,
                    prefetch_batches=2)
    iterator = iter(loader)
    next(iterator)
    threads = list(loader._executor._threads)  # type: ignore[union-attr]
    del loader, iterator  # the loader and its run now only reference each other
    gc.disable()  # so that the collection happens on the worker thread
    try:
        go.set()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        gc.enable()
    for thread in [t for t in threading.enumerate() if t.name == "shardfeed-release"]:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not [e for e in errors if "cannot join" in str(e.exc_value)], errors


def test_garbage_collection_never_joins_threads_close_does(
    clean_ds: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A collection can run inside threading's own bookkeeping while it holds its internal
    # locks; a finaliser that joins threads there deadlocks the whole process.
    import gc

    from shardfeed.pipeline.executor import CpuPool

    waits: list[bool] = []
    shutdown = CpuPool.shutdown

    def spy(self: CpuPool, wait: bool = True, **kwargs: Any) -> None:
        waits.append(wait)
        shutdown(self, wait=wait, **kwargs)

    gc.collect()  # loaders other tests left in reference cycles: not this test's to count
    monkeypatch.setattr(CpuPool, "shutdown", spy)
    dropped = Loader(clean_ds, batch_size=8, transform=presets.train(size=16), num_threads=2)
    next(iter(dropped))
    del dropped
    gc.collect()
    assert waits == [False]

    closed = Loader(clean_ds, batch_size=8, transform=presets.train(size=16), num_threads=2)
    next(iter(closed))
    closed.close()
    closed.close()
    assert waits == [False, True]
