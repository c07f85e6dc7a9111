"""Batches built at once: ``prefetch_batches``, or one a thread where batches are small, so
that many threads share larger slices (a slice's own Python, which holds the GIL, paid less
often an item); never past ``IN_FLIGHT_BYTES`` of batch buffers, never for worker processes
or a sampler with its own image cache; the bytes never change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset

from shardfeed.pipeline import Loader, epoch
from shardfeed.pipeline.options import LoaderOptions
from shardfeed.pipeline.pool import IN_FLIGHT_BYTES, batches_in_flight

PNG28_BATCH = 256 * (28 * 28 + 8)  # 28² gray images and an int64 label: 203 KB
TRAIN_BATCH = 256 * (224 * 224 * 3 + 8)  # the train preset's 224² uint8: 38.5 MB


def _options(threads: int, prefetch: int = 4, **more: Any) -> LoaderOptions:
    return LoaderOptions(batch_size=256, num_threads=threads, prefetch_batches=prefetch, **more)


@pytest.mark.parametrize(("threads", "prefetch", "batch_bytes", "want"), [
    (2, 2, PNG28_BATCH, 2),            # 2 threads, 2 ahead already: as before
    (2, 4, PNG28_BATCH, 4),            # fewer threads than prefetched batches: prefetch
    (16, 4, PNG28_BATCH, 16),          # the node: a batch a thread
    (64, 4, PNG28_BATCH, 64),          # 64 threads: 64 batches, 13 MB
    (64, 4, 2 << 20, 32),              # 2 MiB batches: 64 MiB of them
    (16, 4, TRAIN_BATCH, 4),           # large batches: prefetch
    (16, 4, IN_FLIGHT_BYTES // 8, 8),  # the bound itself
])
def test_small_batches_are_built_one_a_thread_within_the_bound(
        threads: int, prefetch: int, batch_bytes: int, want: int) -> None:
    got = batches_in_flight(_options(threads, prefetch), batch_bytes, own_cache=False)
    assert got == want
    assert got == prefetch or got * batch_bytes <= IN_FLIGHT_BYTES
    assert got <= max(prefetch, threads)


def test_processes_and_an_own_cache_keep_prefetch_batches() -> None:
    # worker processes: a shared ring of prefetch + 2 buffers their names fix
    assert batches_in_flight(_options(16, workers="processes"), PNG28_BATCH,
                             own_cache=False) == 4
    # Patches sized its cache for prefetch_batches of outputs ahead
    assert batches_in_flight(_options(16), PNG28_BATCH, own_cache=True) == 4


def _digest(batch: dict[str, Any]) -> bytes:
    return b"".join(name.encode() + (value.tobytes() if isinstance(value, np.ndarray)
                                     else repr(value).encode())
                    for name, value in sorted(batch.items()))


def _pending_most(loader: Loader) -> tuple[list[bytes], int]:
    """A pass's batches (their bytes) and the most batches it had pending at once."""
    most = 0
    submit = epoch.EpochRun._submit

    def counting(run: Any, index: int) -> None:
        nonlocal most
        submit(run, index)
        most = max(most, len(run.pending))

    epoch.EpochRun._submit = counting  # type: ignore[method-assign]
    try:
        with loader:
            got = [_digest(b) for b in loader]  # each batch dropped as the next comes
            budget = loader.memory_budget()
            ring = len(loader._ring.buffers) if loader._ring is not None else 0
            run = loader.stats().run
    finally:
        epoch.EpochRun._submit = submit  # type: ignore[method-assign]
    assert most <= ring <= most + 1 <= budget.ring_batches  # buffers join as needed
    assert run is not None and run.prefetch == most  # the stats' advice starts from them
    assert run.cpu_seconds > 0
    return got, most


def test_a_loader_of_small_batches_builds_one_a_thread_with_the_same_bytes(
        clean_folder: Path) -> None:
    """8 threads, 2 prefetched: 8 batches of small images pending at once, and the very
    batches of one thread; the memory budget counts the ring's 9 buffers."""
    from shardfeed.transforms import DecodeImage

    def loader(threads: int) -> Loader:
        return Loader(open_dataset(clean_folder), batch_size=4, seed=3, num_threads=threads,
                      prefetch_batches=2, transform=DecodeImage())

    one, one_most = _pending_most(loader(1))
    many, many_most = _pending_most(loader(8))
    assert one_most == 2 and many_most == 8
    assert many == one
    with loader(8) as eight:
        assert eight.memory_budget().ring_batches == 8 + 1


def test_patches_keep_prefetch_batches_whatever_the_threads(tmp_path: Path) -> None:
    from test_patches import write_photos

    from shardfeed.dataset import Dataset
    from shardfeed.pipeline.patches import Patches

    folder = write_photos(tmp_path, 6)

    def loader(threads: int) -> Loader:
        source = Patches(Dataset(str(folder)), size=8, cache_images=2, refresh_every=3)
        return Loader(source, batch_size=4, seed=1, num_threads=threads, prefetch_batches=2,
                      transform=None)

    one, _ = _pending_most(loader(1))
    many, most = _pending_most(loader(8))
    assert most == 2
    assert many == one and len(many) > 1
