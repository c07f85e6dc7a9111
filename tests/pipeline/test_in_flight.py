"""Batches built at once: ``prefetch_batches``, or one a thread where batches are small, so
that many threads share larger slices (a slice's own Python, which holds the GIL, paid less
often an item); never past ``IN_FLIGHT_BYTES`` of batch buffers or what a sampler's own
image cache grants room for, never for worker processes; the bytes never change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset

from shardfeed.pipeline import Loader, epoch
from shardfeed.pipeline.concurrency import BATCHES_A_SLICE
from shardfeed.pipeline.options import LoaderOptions
from shardfeed.pipeline.pool import IN_FLIGHT_BYTES, batches_in_flight

PNG28_BATCH = 256 * (28 * 28 + 8)  # 28² gray images and an int64 label: 203 KB
TRAIN_BATCH = 256 * (224 * 224 * 3 + 8)  # the train preset's 224² uint8: 38.5 MB


def _options(threads: int, prefetch: int = 4, **more: Any) -> LoaderOptions:
    return LoaderOptions(batch_size=256, num_threads=threads, prefetch_batches=prefetch, **more)


@pytest.mark.parametrize(("threads", "prefetch", "batch_bytes", "want"), [
    (2, 2, PNG28_BATCH, 2),            # 2 threads, 2 ahead already: as before
    (2, 4, PNG28_BATCH, 4),            # fewer threads than prefetched batches: prefetch
    (16, 4, PNG28_BATCH, 64),          # the node: 4 batches a thread (a slice's most)
    (64, 4, PNG28_BATCH, 256),         # 64 threads: 256 batches, 52 MB
    (64, 4, 2 << 20, 32),              # 2 MiB batches: 64 MiB of them
    (8, 4, 2 << 20, 8),                # 2 MiB batches (not small): one a thread
    (8, 4, 1 << 20, 32),               # 1 MiB batches (small): 4 a thread
    (16, 4, 1 << 20, 64),              # 4 a thread: 64 MiB of them
    (16, 4, TRAIN_BATCH, 4),           # large batches: prefetch
    (16, 4, IN_FLIGHT_BYTES // 8, 8),  # the bound itself
])
def test_small_batches_are_built_up_to_a_few_a_thread_within_the_bound(
        threads: int, prefetch: int, batch_bytes: int, want: int) -> None:
    got = batches_in_flight(_options(threads, prefetch), batch_bytes)
    assert got == want
    assert got == prefetch or got * batch_bytes <= IN_FLIGHT_BYTES
    assert got <= max(prefetch, threads * BATCHES_A_SLICE)


def test_processes_keep_prefetch_batches_and_a_cache_grants_its_room() -> None:
    asked: list[int] = []

    def room(granted: int) -> Any:
        def room_in_flight(span: int) -> int:
            asked.append(span)
            return min(span, granted)
        return room_in_flight

    # asked for the positions of the batches wanted (16 of 256), given those it has room for
    assert batches_in_flight(_options(16), PNG28_BATCH, room_in_flight=room(12 * 256 + 9)) == 12
    assert asked == [16 * 256]
    assert batches_in_flight(_options(16), PNG28_BATCH, room_in_flight=room(10**9)) == 16
    assert batches_in_flight(_options(16), PNG28_BATCH, room_in_flight=room(0)) == 4  # prefetch
    assert batches_in_flight(_options(16), TRAIN_BATCH, room_in_flight=room(10**9)) == 4
    assert batches_in_flight(_options(2, 2), PNG28_BATCH, room_in_flight=room(0)) == 2
    assert asked[-1] == 2 * 256  # room asked for the prefetched batches too
    # 8 ranks: a rank's batch of 256 lies within 8 x 256 positions of the epoch
    assert batches_in_flight(_options(16, world_size=8, rank=3), PNG28_BATCH,
                             room_in_flight=room(6 * 8 * 256 + 7)) == 6
    assert asked[-1] == 16 * 8 * 256
    # worker processes: a shared ring of prefetch + 2 buffers their names fix; the room for
    # the prefetched batches asked all the same
    assert batches_in_flight(_options(16, workers="processes"), PNG28_BATCH,
                             room_in_flight=room(10**9)) == 4
    assert asked[-1] == 4 * 256


def _digest(batch: dict[str, Any]) -> bytes:
    return b"".join(name.encode() + (value.tobytes() if isinstance(value, np.ndarray)
                                     else repr(value).encode())
                    for name, value in sorted(batch.items()))


def _pending_most(loader: Loader) -> tuple[list[bytes], int]:
    """A pass's batches (their bytes) and the most batches it had pending at once."""
    most = 0
    pending = epoch.EpochRun._pending

    def counting(run: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal most
        made = pending(run, *args, **kwargs)
        most = max(most, len(run.pending))
        return made

    epoch.EpochRun._pending = counting  # type: ignore[method-assign]
    try:
        with loader:
            got = [_digest(b) for b in loader]  # each batch dropped as the next comes
            budget = loader.memory_budget()
            ring = len(loader._ring.buffers) if loader._ring is not None else 0
            run = loader.stats().run
    finally:
        epoch.EpochRun._pending = pending  # type: ignore[method-assign]
    assert most <= ring <= most + 1 <= budget.ring_batches  # buffers join as needed
    # the stats' advice starts from the most (fewer while slices are within a batch)
    assert run is not None and most <= run.prefetch
    assert run.cpu_seconds > 0
    return got, most


def test_a_loader_of_small_batches_builds_one_a_thread_with_the_same_bytes(
        clean_folder: Path) -> None:
    """8 threads, 2 prefetched: a batch a thread of small images pending at once while the
    slices are within a batch (8; up to 4 a thread for slices of several, 32), and the very
    batches of one thread; the memory budget counts the ring's 33 buffers."""
    from shardfeed.transforms import DecodeImage

    def loader(threads: int) -> Loader:
        return Loader(open_dataset(clean_folder), batch_size=4, seed=3, num_threads=threads,
                      prefetch_batches=2, transform=DecodeImage())

    one, one_most = _pending_most(loader(1))
    many, many_most = _pending_most(loader(8))
    assert one_most == 2 and many_most == 8
    assert many == one
    with loader(8) as eight:
        assert eight.memory_budget().ring_batches == 8 * BATCHES_A_SLICE + 1


def test_patches_build_more_at_once_with_a_cache_grown_for_them(tmp_path: Path) -> None:
    """8 threads, 2 prefetched: Patches (N = 8, R = 4, batches of 4) grants room for the 32
    outputs of 8 batches (8 images), so 8 batches are built at once and the cache's derived
    bound holds N + 8 images and those decoded ahead; each image is decoded once a
    residency, and the batches are one thread's. A stated ``cache_bytes`` keeps its bound
    and the batches prefetched, even where its ``max(2, N // 8)`` images would span more."""
    from test_patches import HEIGHT, WIDTH, write_photos

    from shardfeed.dataset import Dataset
    from shardfeed.pipeline.patch_ahead import LOOK_AHEAD_IMAGES
    from shardfeed.pipeline.patches import Patches

    folder = write_photos(tmp_path, 16, masks=False)

    def loader(threads: int, **more: Any) -> tuple[Loader, Patches]:
        source = Patches(Dataset(str(folder)), size=8, cache_images=8,
                         refresh_every=more.pop("refresh_every", 4), **more)
        return Loader(source, batch_size=4, seed=1, num_threads=threads, prefetch_batches=2,
                      transform=None), source

    first, alone = loader(1)
    one, _ = _pending_most(first)
    eight, patches = loader(8)
    many, most = _pending_most(eight)
    assert most == 8
    assert many == one and len(many) == 9  # (16 - 8 + 1) x 4 outputs
    stats, once = patches.cache_stats(), alone.cache_stats()
    assert stats is not None and stats.max_bytes is not None and once is not None
    # each image used decoded once, as by one thread
    assert stats.loads == once.loads and stats.uncached == stats.evictions == 0
    image = HEIGHT * WIDTH * 3  # write_photos' images (and a little of their features)
    images = 8 + 8 + LOOK_AHEAD_IMAGES
    assert images * image <= stats.max_bytes <= images * (image + 1024)
    # 2 images a refresh of 16 would span 8 batches: the stated bound keeps 2
    stated, _ = loader(8, cache_bytes=10**6, refresh_every=16)
    assert _pending_most(stated)[1] == 2


def test_patches_grant_room_up_to_their_cache_again_and_a_byte_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``room_in_flight``: an image a refresh the span covers, up to ``N`` images and,
    beyond the ``max(2, N // 8)`` always there, ``IN_FLIGHT_IMAGE_BYTES`` of the largest
    image; the default bound grown by those, the look-ahead left the rest; a stated
    ``cache_bytes`` grants none, no cache all of it."""
    from test_patches import HEIGHT, WIDTH, write_photos

    from shardfeed.dataset import Dataset
    from shardfeed.pipeline import patches as patches_module
    from shardfeed.pipeline.patch_ahead import LOOK_AHEAD_IMAGES
    from shardfeed.pipeline.patches import Patches

    ds = Dataset(str(write_photos(tmp_path, 40, masks=False)))

    def made() -> Patches:
        patches = Patches(ds, size=8, cache_images=32, refresh_every=10)
        with Loader(patches, batch_size=4, seed=1, num_threads=1) as loader:
            next(iter(loader))  # an image decoded: its size known
        return patches

    patches = made()
    cache = patches.cache
    assert cache is not None
    largest = cache.largest_bytes
    assert HEIGHT * WIDTH * 3 < largest < HEIGHT * WIDTH * 3 + 1024

    def bound_images() -> float:
        assert cache.max_bytes is not None
        return cache.max_bytes / largest

    base = 32 + 4 + LOOK_AHEAD_IMAGES
    assert bound_images() == base
    assert patches.room_in_flight(35) == 35  # 4 images: the 4 always there
    assert bound_images() == base
    assert patches.room_in_flight(120) == 120  # 12 images
    assert bound_images() == base + 8
    assert patches.room_in_flight(1000) == 320  # 32 images at most
    assert bound_images() == base + 28
    assert patches.room_in_flight(35) == 35  # never shrinks
    assert bound_images() == base + 28
    # the look-ahead takes the room left beside the images in flight
    assert patches._slack == 32
    # room for 6 more images of theirs
    monkeypatch.setattr(patches_module, "IN_FLIGHT_IMAGE_BYTES", 6 * largest)
    bounded = made()
    assert bounded.room_in_flight(1000) == 100  # the 4, and 6
    assert bounded.cache is not None and bounded.cache.max_bytes == (base + 6) * largest
    monkeypatch.setattr(patches_module, "IN_FLIGHT_IMAGE_BYTES", 1)
    assert made().room_in_flight(1000) == 40  # the 4 always there
    stated = Patches(ds, size=8, cache_images=32, refresh_every=10, cache_bytes=10**7)
    assert stated.room_in_flight(1000) == 0
    assert Patches(ds, size=8, cache_images=32, refresh_every=10,
                   cache=False).room_in_flight(1000) == 1000


def test_a_grown_bound_stays_within_its_bytes_as_larger_images_come() -> None:
    """The images added for the batches in flight are counted again at each larger value:
    a small first image does not let 32 large ones in."""
    from shardfeed.pipeline.image_cache import ImageCache

    cache: ImageCache[bytes] = ImageCache(default_images=4)
    cache.get("small", lambda: (b"s", 100), expires=(0, 9), now=(0, 0))
    cache.grow(32, most_bytes=1000)
    assert cache.max_bytes == 4 * 100 + 1000  # 10 more small ones: within 1000
    cache.get("large", lambda: (b"l", 10_000), expires=(0, 9), now=(0, 1))
    assert cache.max_bytes == 4 * 10_000 + 1000  # not 36 x 10,000
    cache.grow(2, most_bytes=10**9)  # never lowered: 32 images, 10**9 bytes
    assert cache.max_bytes == 36 * 10_000
    stated: ImageCache[bytes] = ImageCache(max_bytes=5000, default_images=4)
    stated.grow(8, most_bytes=10**9)
    stated.get("a", lambda: (b"a", 100), expires=(0, 9), now=(0, 0))
    assert stated.max_bytes == 5000


def test_patches_in_flight_never_decode_an_image_twice_a_residency(tmp_path: Path) -> None:
    """More images than the grown bound holds (60 against N + 16 + L, N = 16, R = 2): images
    are pushed out, yet with 8 batches in flight at 8 threads (32 outputs: 16 refreshes)
    each image is decoded once, as by one thread, and the batches are the same."""
    from test_patches import write_photos

    from shardfeed.dataset import Dataset
    from shardfeed.pipeline.patches import Patches

    folder = write_photos(tmp_path, 60, masks=False)

    def run(threads: int) -> tuple[list[bytes], Any, int]:
        patches = Patches(Dataset(str(folder)), size=8, cache_images=16, refresh_every=2)
        loader = Loader(patches, batch_size=4, seed=5, num_threads=threads,
                        prefetch_batches=2, transform=None)
        got, most = _pending_most(loader)
        return got, patches.cache_stats(), most

    one, alone, _ = run(1)
    many, stats, most = run(8)
    assert most == 8 and many == one
    assert stats is not None and alone is not None
    assert stats.evictions > 0  # the set does not fit: images were pushed out
    assert stats.loads == alone.loads and stats.uncached == 0


def test_the_batches_in_flight_built_newest_first_decode_each_image_once(
        tmp_path: Path) -> None:
    """The worst order threads may build the batches in flight in: each window of them
    newest first, every output through the cache as the sample path asks. With batches of
    N (every resident image used by each), 8 batches at R = 8 span 16 refreshes: 32 images
    at once, more than the bound's own room (N + ``max(2, N // 8)`` + the look-ahead's L,
    24 on 2 cores; without the growth 92 loads for 61 images). The cache grown for them
    keeps every image until its last output: each decoded once. With 8 ranks a rank's
    batches lie in a span 8 times as long: the loader keeps its 2 prefetched batches, and
    the cache grows to N images beyond N."""
    from test_patches import write_photos

    from shardfeed.dataset import Dataset
    from shardfeed.pipeline.patches import Patches

    ds = Dataset(str(write_photos(tmp_path, 64, masks=False)))

    def built_newest_first(world_size: int) -> tuple[Patches, int, set[int]]:
        patches = Patches(ds, size=8, cache_images=16, refresh_every=8)
        with Loader(patches, batch_size=16, seed=1, num_threads=8, prefetch_batches=2,
                    transform=None, rank=0, world_size=world_size) as loader:
            loader.batch_layout()
            at_once = loader._in_flight
            ctx, positions = loader._context(), loader._positions(0)
            patches.begin_pass()
            batches = len(positions) // 16
            used = set()
            for first in range(0, batches, at_once):
                for b in reversed(range(first, min(first + at_once, batches))):
                    for position in positions[b * 16 : (b + 1) * 16]:
                        sample, _ = loader._builder.sample_at(ctx, int(position))
                        used.add(int(sample["patch/record"]))
        return patches, at_once, used

    patches, at_once, used = built_newest_first(1)
    stats = patches.cache_stats()
    assert at_once == 8 and patches._slack == 16
    assert stats is not None and stats.evictions > 0  # the set does not fit
    assert stats.loads == len(used)
    ranks, at_once, _ = built_newest_first(8)
    assert at_once == 2 and ranks._slack == 16
