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
