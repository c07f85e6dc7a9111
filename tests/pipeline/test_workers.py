"""Process workers: the same bytes as threads, errors and skips across the process boundary."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, record_ids, train_transform

from shardfeed.errors import DecodeError
from shardfeed.pipeline import Loader


def stream(loader: Loader, epochs: int = 1) -> list[dict[str, Any]]:
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append({k: v.copy() if isinstance(v, np.ndarray) else v
                        for k, v in batch.items()})
    return out


def assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for key in x:
            if isinstance(x[key], np.ndarray):
                assert x[key].dtype == y[key].dtype
                assert x[key].tobytes() == y[key].tobytes(), key
            else:
                assert x[key] == y[key], key


def test_processes_give_thread_bytes(clean_ds: Any) -> None:
    options: dict[str, Any] = {"batch_size": 16, "seed": 11, "transform": train_transform(),
                               "prefetch_batches": 2}
    with Loader(clean_ds, num_threads=2, **options) as threads:
        expected = stream(threads, epochs=2)
    with Loader(clean_ds, num_threads=2, workers="processes", **options) as processes:
        got = stream(processes, epochs=2)
        state = processes.state()
    assert_same(got, expected)
    assert state["epoch"] == 2


def test_processes_skip_and_raise(bad_jpeg_folder: Path) -> None:
    ds = open_dataset(bad_jpeg_folder)
    options: dict[str, Any] = {"batch_size": 8, "seed": 3, "transform": train_transform(),
                               "num_threads": 2}
    with Loader(ds, on_error="skip", **options) as threads:
        expected = record_ids(stream(threads))
    with Loader(ds, on_error="skip", workers="processes", **options) as processes:
        assert record_ids(stream(processes)) == expected
        assert processes.stats().skipped_total == 1
    path, in_shard, offset = ds.locate(41)
    with Loader(ds, workers="processes", **options) as processes, pytest.raises(
        DecodeError
    ) as info:
        stream(processes)
    assert (info.value.path, info.value.record, info.value.offset) == (path, in_shard, offset)


class Boom(RuntimeError):
    pass


def failing_in_worker(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    if int(sample["index"][0]) == 30:
        raise Boom("python transform failed")
    return sample


def test_process_worker_exception_names_record(clean_ds: Any) -> None:
    with Loader(clean_ds, batch_size=8, shuffle=False, transform=failing_in_worker,
                num_threads=2, workers="processes") as loader, pytest.raises(Boom) as info:
        stream(loader)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "record id 30" in notes and "epoch position 30" in notes
    # the worker's traceback comes along as the cause
    cause = "".join(traceback.format_exception(info.value))
    assert "failing_in_worker" in cause
