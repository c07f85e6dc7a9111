"""``Loader(adaptive_threads=False)``: every thread builds at once, never measured (a user
who knows the work gains from threads, or who times the loader against a held baseline);
the bytes are the measured loader's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardfeed.pipeline import Loader
from shardfeed.transforms import DecodeImage


def _images(loader: Loader, epochs: int) -> list[np.ndarray]:
    with loader:
        return [b["image"].copy() for _ in range(epochs) for b in loader]


def test_a_held_loader_builds_with_every_thread_and_the_same_bytes(clean_ds: Any) -> None:
    held = Loader(clean_ds, batch_size=8, seed=5, num_threads=2, transform=DecodeImage(),
                  adaptive_threads=False)
    got = _images(held, 12)  # 1,236 samples: past the warm-up, into the first trial
    stats = held._gate.stats()
    assert set(stats.seconds) == {2} and stats.trials == 0 and stats.off_choice_seconds == 0
    reference = _images(Loader(clean_ds, batch_size=8, seed=5, num_threads=1,
                               transform=DecodeImage()), 12)
    assert len(got) == len(reference)
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a, b)


def test_adaptive_threads_takes_a_bool(clean_ds: Any) -> None:
    with pytest.raises(TypeError, match="adaptive_threads must be True or False"):
        Loader(clean_ds, batch_size=8, adaptive_threads="no")  # type: ignore[arg-type]


class _Bounded:
    """A pass-through batch stage that asks for at most ``slice_threads`` slice threads."""

    def __init__(self, threads: int) -> None:
        self.slice_threads = threads

    def __call__(self, batch: dict[str, Any], keys: Any, /) -> dict[str, Any]:
        return batch

    def state(self) -> dict[str, Any]:
        return {"stage": "bounded"}

    def restore(self, state: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Counting:
    """A transform that records how many samples are being made at once."""

    def __init__(self) -> None:
        import threading

        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def __call__(self, sample: dict[str, Any], rng: Any) -> dict[str, Any]:
        import time

        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.002)  # releases the GIL, as a decode does: threads would overlap here
        with self.lock:
            self.now -= 1
        return {"label": np.int64(len(sample))}


@pytest.mark.parametrize("bound", [1, 2])
def test_a_stage_that_bounds_slice_threads_is_obeyed_and_keeps_the_bytes(
        clean_ds: Any, bound: int) -> None:
    counting = _Counting()
    loader = Loader(clean_ds, batch_size=8, seed=5, num_threads=6, transform=counting,
                    adaptive_threads=False)
    loader.add_batch_stage(_Bounded(bound))
    with loader:
        bounded = [b["label"].copy() for b in loader]
    assert counting.most == bound
    free = _Counting()
    with Loader(clean_ds, batch_size=8, seed=5, num_threads=6, transform=free,
                adaptive_threads=False) as loader:
        unbounded = [b["label"].copy() for b in loader]
    assert free.most > 2  # the same loader without the stage builds side by side
    for a, b in zip(bounded, unbounded, strict=True):
        np.testing.assert_array_equal(a, b)
