"""close() from another thread while a slice is being made: the slice stops at its next
sample (a slow user transform does not hold close() for the rest of the slice), and the
next() waiting raises an error that says the Loader was closed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardfeed
from shardfeed.format.writer import ShardWriter

SAMPLE_SECONDS = 0.4


@pytest.mark.parametrize("threads", [1, 2])
def test_close_stops_a_slice_at_its_next_sample(tmp_path: Path, threads: int) -> None:
    with ShardWriter(tmp_path / "a.tfrecord") as writer:
        for i in range(64):
            writer.write_example({"x": np.arange(4) + i})
    made: list[int] = []

    def slow(sample: dict[str, Any], rng: Any) -> dict[str, Any]:
        time.sleep(SAMPLE_SECONDS)
        made.append(int(sample["x"][0]))
        return sample

    loader = shardfeed.Loader(shardfeed.Dataset(str(tmp_path)), batch_size=8, transform=slow,
                              num_threads=threads)
    batches = iter(loader)
    raised: list[BaseException] = []

    def consume() -> None:
        try:
            next(batches)
        except Exception as exc:  # noqa: BLE001 - checked below
            raised.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    while len(made) < 2:  # a slice is under way (the first sample: the loader's look at
        time.sleep(0.01)  # the data, made on the caller's thread)
    began = time.monotonic()
    loader.close()
    took = time.monotonic() - began
    consumer.join(timeout=30)
    # the sample under way at most, not the slice's other samples (8 of 0.4 s at one thread)
    assert took < 2 * SAMPLE_SECONDS + 0.5, f"close() took {took:.2f} s"
    assert raised and isinstance(raised[0], RuntimeError), raised
    assert "closed" in str(raised[0])
    count = len(made)
    time.sleep(2 * SAMPLE_SECONDS)
    assert len(made) == count  # no sample is made after close() returned
