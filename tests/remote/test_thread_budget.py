"""The thread inventory (``Loader.thread_budget()``) names every thread a loader runs, within the
bound of its pool: over object storage with a disk cache and read-ahead (moto on 127.0.0.1),
and locally with Patches' decodes ahead; a pass beyond the read-ahead pool's bound reads as
its batches need, with the same batches."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from shardfeed import Dataset, Loader, Patches
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import read_ahead
from shardfeed.pipeline.thread_budget import ThreadBudget
from shardfeed.storage.daemon_threads import DaemonThreads

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2,
           "rank": 0, "world_size": 1}


def unaccounted(budget: ThreadBudget,
                before: set[threading.Thread]) -> tuple[list[str], dict[str, int]]:
    """Live ``shardfeed-*`` threads that no row names, and rows running more than their most;
    ``before``: threads of the process before this test's loader (another test's loader,
    closed, whose idle threads have not yet ended: an earlier run of this suite counted
    three such 2-thread pools against this loader's bound of 2)."""
    counts: collections.Counter[str] = collections.Counter()
    stray = []
    for thread in threading.enumerate():
        if not thread.name.startswith("shardfeed") or thread in before:
            continue
        row = next((r for r in budget.pools
                    if thread.name == r.name or thread.name.startswith(r.name + "_")), None)
        if row is None:
            stray.append(thread.name)
        else:
            counts[row.name] += 1
    over = {name: n for name, n in counts.items()
            if n > next(r.most for r in budget.pools if r.name == name)}
    return stray, over


def test_every_thread_of_a_remote_cached_loader_is_in_its_inventory(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    url = s3_server.upload_folder(records_dataset(240, 4))
    before = set(threading.enumerate())
    with Dataset(url, cache_dir=tmp_path / "cache") as ds, Loader(ds, **OPTIONS) as loader:
        seen = []
        for epoch in range(2):
            for k, _ in enumerate(loader):
                if k in (3, 20):  # mid-pass: reads, fetches and cache waits in flight
                    budget = loader.thread_budget()
                    seen.append((epoch, k, *unaccounted(budget, before)))
        budget = loader.thread_budget()
    assert all(not stray and not over for *_, stray, over in seen), seen
    names = {row.name for row in budget.pools}
    assert {"shardfeed-loader", "shardfeed-shards", "shardfeed-ahead", "shardfeed-storage",
            "shardfeed-read-ahead", "shardfeed-cache-read"} <= names
    assert budget.row("shardfeed-loader").most == 2  # type: ignore[union-attr]
    assert all(0 <= row.now <= row.most for row in budget.pools), str(budget)
    assert budget.most < 2000 and "shardfeed-storage" in str(budget)


def _big_jpegs(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    with ShardWriter(str(folder / "big.tfrecord")) as writer:
        for i in range(n):
            image = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
            writer.write_example({"image/encoded": simplejpeg.encode_jpeg(image, quality=80),
                                  "label": [i]})
    return folder


def test_patches_decodes_ahead_are_in_the_inventory(tmp_path: Path) -> None:
    ds = Dataset(str(_big_jpegs(tmp_path / "big", 24)))
    before = set(threading.enumerate())
    patches = Patches(ds, size=32, cache_images=4, refresh_every=8)
    with Loader(patches, batch_size=16, shuffle=True, seed=0, num_threads=2) as loader:
        checks = []
        for k, _ in enumerate(loader):
            if k % 3 == 0:
                checks.append(unaccounted(loader.thread_budget(), before))
        budget = loader.thread_budget()
    assert checks and all(not stray and not over for stray, over in checks), checks
    decode = budget.row("shardfeed-patch-decode")
    assert decode is not None and 1 <= decode.now <= decode.most


def test_a_pass_beyond_the_read_ahead_bound_reads_as_its_batches_need(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    with Dataset(str(folder)) as local, Loader(local, **OPTIONS) as loader:
        expected = [b["index"].tolist() for b in loader]
    full = DaemonThreads("shardfeed-read-ahead", limit=1, why="a test")
    release = threading.Event()
    busy = full.submit(release.wait)  # the one pass the bound allows, held
    monkeypatch.setattr(read_ahead, "_THREADS", full)
    timer = threading.Timer(30, release.set)  # were the pass to wait for a thread
    timer.start()
    try:
        with Dataset(url, cache_dir=tmp_path / "cache") as ds, Loader(ds, **OPTIONS) as loader:
            got = [b["index"].tolist() for b in loader]
            assert loader.thread_budget().row("shardfeed-read-ahead") is not None
        assert not release.is_set(), "the pass waited for a read-ahead thread"
    finally:
        timer.cancel()
        release.set()
    assert busy.result(5) is True
    assert got == expected
    assert full.threads == 1  # nothing else started on it
