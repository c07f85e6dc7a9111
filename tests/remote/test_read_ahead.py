"""Read-ahead and the disk cache over S3-compatible storage (moto on 127.0.0.1), as a user
runs them: epochs, a second run, a quarter-size cache, a damaged entry, a server gone."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset, Loader, StorageError
from shardfeed.pipeline.cache_policy import hit_rates
from shardfeed.storage.disk_cache import DiskCache

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2,
           "rank": 0, "world_size": 1}


def stream(loader: Loader) -> list[tuple[list[int], list[bytes]]]:
    return [(b["index"].tolist(), list(b["name"])) for b in loader]


def data_gets(server: Any) -> int:
    """GETs of shard bytes (not the manifest, indexes or listings)."""
    return sum(1 for r in server.requests("GET") if r.path.endswith(".tfrecord"))


def local_epochs(folder: Path, epochs: int, **options: Any) -> list[list[Any]]:
    with Dataset(str(folder)) as ds, Loader(ds, **{**OPTIONS, **options}) as loader:
        return [stream(loader) for _ in range(epochs)]


def test_epoch_two_and_the_next_run_send_no_request_for_records(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    expected = local_epochs(folder, 2)
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        first = stream(loader)
        assert data_gets(s3_server) > 0
        s3_server.clear_log()
        second = stream(loader)
        assert data_gets(s3_server) == 0
        stats = ds.storage_stats()
    assert [first, second] == expected
    assert stats["cache_hits"] >= 240 and stats["cache_admitted"] + stats["cache_hits"] >= 480
    s3_server.clear_log()
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:  # a new run
        assert stream(loader) == expected[0]
    assert data_gets(s3_server) == 0


def test_epochs_read_the_cache_on_the_same_threads(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread started for every pass would take another malloc arena each epoch, and a
    process reading a cached dataset grew by the bytes of a few chunks every epoch."""
    from shardfeed.dataset.fetch_ahead import AheadSession
    from shardfeed.storage.disk_cache import DiskCache

    url = s3_server.upload_folder(records_dataset(240, 4))
    threads: dict[str, list[threading.Thread]] = {"schedule": [], "read": []}
    schedule, read_entries = AheadSession.schedule, DiskCache.read_entries

    def spy_schedule(self: Any, *args: Any, **kwargs: Any) -> None:
        threads["schedule"].append(threading.current_thread())
        schedule(self, *args, **kwargs)

    def spy_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        threads["read"].append(threading.current_thread())
        return read_entries(self, *args, **kwargs)

    monkeypatch.setattr(AheadSession, "schedule", spy_schedule)
    monkeypatch.setattr(DiskCache, "read_entries", spy_read)
    with Dataset(url, cache_dir=tmp_path / "cache") as ds, \
            Loader(ds, **{**OPTIONS, "read_ahead": 2}) as loader:
        stream(loader)  # fills the cache
        for seen in threads.values():
            seen.clear()
        for _ in range(6):
            stream(loader)
    scheduling = {t for t in threads["schedule"] if t is not threading.current_thread()}
    assert len(threads["read"]) >= 6 * 240 // 8 // 2 and len(scheduling) >= 1
    assert len(scheduling) <= 2  # a pass's thread is the next pass's (one may overlap)
    assert len(set(threads["read"])) <= 4  # the cache-read threads, not the scheduling one
    assert not scheduling & set(threads["read"])


def test_a_starved_scheduling_thread_delays_batches_rather_than_reading_around_the_cache(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine the thread that schedules chunks can fall behind the batches: a
    batch read before its chunk is scheduled would fetch its records one by one and leave
    them out of the cache (the next epoch then sends requests again)."""
    from shardfeed.dataset.fetch_ahead import AheadSession

    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    expected = local_epochs(folder, 2, read_ahead=2)
    schedule = AheadSession.schedule

    def slow(self: AheadSession, chunk: int, *args: Any, **kwargs: Any) -> None:
        if chunk & 0xFFFFFF:  # every chunk but an epoch's first, as a starved thread
            time.sleep(0.05)
        schedule(self, chunk, *args, **kwargs)

    monkeypatch.setattr(AheadSession, "schedule", slow)
    with Dataset(url, cache_dir=tmp_path / "cache") as ds, \
            Loader(ds, **{**OPTIONS, "read_ahead": 2}) as loader:
        first = stream(loader)
        s3_server.clear_log()
        second = stream(loader)
        assert data_gets(s3_server) == 0  # every record of the first epoch went by the cache
    assert [first, second] == expected


def test_a_cache_that_holds_everything_is_read_when_built_not_staged(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    """Nothing a pass keeps evicts what a cache as large as the data holds: its records are
    read by the batch that needs them, as from local files, not held in memory ahead (which
    took memory for chunks and a page fault a fresh page). A bounded cache stages them: what
    it holds now may be evicted for what the next chunks keep."""
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    expected = local_epochs(folder, 2, read_ahead=2)
    with Dataset(url, cache_dir=tmp_path / "all") as ds, \
            Loader(ds, **{**OPTIONS, "read_ahead": 2}) as loader:
        first = stream(loader)
        before = ds.storage_stats()
        s3_server.clear_log()
        second = stream(loader)
        after = ds.storage_stats()
    assert [first, second] == expected and data_gets(s3_server) == 0
    # every record of the second epoch from the cache (the first epoch's are all fetched: the
    # cache starts empty). Counted over both epochs: the second epoch's first chunks may be
    # looked up before the first ends (read-ahead carries them across; on a loaded machine
    # 8-16 of 240 were), and a record the first epoch's last chunk was still writing is
    # looked up once more (up to a tenth)
    assert 240 <= after["cache_hits"] <= 240 + 240 // 10
    assert after["staged_hits"] - before["staged_hits"] <= 240 // 10
    with Dataset(str(folder)) as local:
        payload = sum(len(p) for p in local.read_payloads(range(240)))
    with Dataset(url, cache_dir=tmp_path / "half", cache_bytes=payload // 2) as ds, \
            Loader(ds, **{**OPTIONS, "read_ahead": 2}) as loader:
        stream(loader)
        before = ds.storage_stats()
        assert stream(loader) == expected[1]
        after = ds.storage_stats()
    hits = after["cache_hits"] - before["cache_hits"]
    # staged, not read when built: all but the odd record a loaded machine's batch reached
    # before its chunk was staged (a cache as large as the data stages at most a tenth)
    assert hits > 0 and after["staged_hits"] - before["staged_hits"] >= 240 - 240 // 10


def test_plain_reads_use_the_cache_too(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    url = s3_server.upload_folder(records_dataset(60, 3))
    with Dataset(url, cache_dir=tmp_path / "c") as ds:
        first = ds.read_many(range(60))
        s3_server.clear_log()
        assert ds.read_many(range(60)) == first
    assert data_gets(s3_server) == 0


def test_a_quarter_size_cache_keeps_what_the_optimal_policy_keeps(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    options = {**OPTIONS, "read_ahead": 4}
    expected = local_epochs(folder, 3, read_ahead=4)
    with Dataset(str(folder)) as local:
        payload = sum(len(p) for p in local.read_payloads(range(240)))
    quarter = payload // 4
    with Dataset(url, cache_dir=tmp_path / "c", cache_bytes=quarter) as ds, \
            Loader(ds, **options) as loader:
        got = [stream(loader) for _ in range(3)]
        rates = hit_rates(loader, cache_bytes=quarter, epochs=range(3))
        done = hit_rates(loader, cache_bytes=quarter, epochs=range(3), carried=True)["optimal"]
        # the read-ahead fetches the fourth epoch's first chunks in the background while the
        # third ends: as many as it scheduled before the stream ended, which a busy machine
        # makes fewer (one parallel suite run counted 730 accesses of the 744 with all of
        # them); wait until they are all in, or until no more come
        deadline, last, still = time.monotonic() + 60, -1, time.monotonic()
        while True:
            stats = ds.storage_stats()
            seen = stats["cache_hits"] + stats["cache_misses"]
            if seen != last:
                last, still = seen, time.monotonic()
            if (seen >= done.accesses or time.monotonic() > deadline
                    or (seen >= 720 and time.monotonic() - still > 2.0)):
                break
            time.sleep(0.05)
        held = DiskCache(tmp_path / "c", max_bytes=quarter).summary().bytes
    assert got == expected
    assert 0 < held <= quarter
    optimal, lru = rates["optimal"], rates["lru"]
    # 720 accesses of the look-ahead over 3 epochs; as the third ended, it read some of the
    # fourth's first chunks too (all of them: ``done``); and the record or two the loader
    # reads first to learn the batch layout (before the look-ahead starts)
    assert optimal.accesses == 720 and 720 < done.accesses < 800
    assert 720 <= stats["cache_hits"] + stats["cache_misses"] <= done.accesses + 2
    # the cache ran the optimal policy: its hits over the 3 epochs are the replay's (the
    # probe's records, read before the look-ahead, are found by the first chunk: one hit
    # each), and the fourth epoch's chunks read add at most the replay's hits in them
    assert optimal.hits <= stats["cache_hits"] <= done.hits + 2, (stats, optimal, done)
    assert optimal.rate > 0.15 and optimal.rate > 3 * lru.rate  # about 1/6 vs 1/50 here


def test_a_damaged_cache_file_is_detected_and_fetched_again(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(120, 2)
    url = s3_server.upload_folder(folder)
    expected = local_epochs(folder, 1)[0]
    cache = tmp_path / "c"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        stream(loader)
    victim = sorted((cache / "data").rglob("*.rec"))[5]
    blob = bytearray(victim.read_bytes())
    blob[-3] ^= 0x40
    victim.write_bytes(bytes(blob))
    s3_server.clear_log()
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert stream(loader) == expected
        stats = ds.storage_stats()
    assert stats["cache_corrupt"] == 1
    assert 1 <= data_gets(s3_server) <= 2  # the damaged record (and its neighbours) only
    assert DiskCache(cache, max_bytes=1 << 30).verify() == []


def test_read_ahead_coalesces_batches_into_few_requests(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    counts = {}
    for ahead in (0, 8):
        s3_server.clear_log()
        with Dataset(url) as ds, Loader(ds, **{**OPTIONS, "read_ahead": ahead}) as loader:
            assert stream(loader) == local_epochs(folder, 1)[0]
        counts[ahead] = data_gets(s3_server)
    assert counts[8] * 3 <= counts[0], counts


def test_a_pass_reading_ahead_builds_prefetch_batches_at_once_however_small(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """Small batches and many threads build a batch a thread at once on local data (more
    only for slices of several batches); a pass that reads ahead keeps
    ``prefetch_batches`` (a batch's submit waits for its records' chunk, and batches
    submitted far ahead would hold up those already built)."""
    from shardfeed.pipeline import epoch

    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    most: dict[str, int] = {}
    pending = epoch.EpochRun._pending
    where = "local"

    def counting(run: Any, *args: Any, **kwargs: Any) -> Any:
        made = pending(run, *args, **kwargs)
        most[where] = max(most.get(where, 0), len(run.pending))
        return made

    options = {**OPTIONS, "num_threads": 8, "prefetch_batches": 2}
    epoch.EpochRun._pending = counting  # type: ignore[method-assign]
    try:
        expected = local_epochs(folder, 1, **options)[0]
        where = "remote"
        with Dataset(url) as ds, Loader(ds, **options) as loader:
            assert stream(loader) == expected
            assert loader._run is not None and loader._run.read_ahead is not None
            # the ring made the buffers those need, not those 8 at once would
            assert loader._ring is not None and len(loader._ring.buffers) == 2 + 1
            loader.set_epoch(1)  # the pass ends: the stats still say what it built at once
            stats = loader.stats().run
            assert stats is not None and stats.prefetch == 2
    finally:
        epoch.EpochRun._pending = pending  # type: ignore[method-assign]
    assert most == {"local": 8, "remote": 2}


def test_under_latency_every_record_comes_from_the_look_ahead(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """50 ms a request: no slice reads a record itself (each waits, at most, for the fetch
    of its chunk already in flight); how much time that saves is measured in
    bench/bench_remote_cache.py."""
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    s3_server.latency_seconds = 0.05
    with Dataset(url) as ds, Loader(ds, **{**OPTIONS, "read_ahead": 8}) as loader:
        assert stream(loader) == local_epochs(folder, 1, read_ahead=8)[0]
        stats = ds.storage_stats()
    assert stats["staged_hits"] == 240


def test_a_server_gone_for_good_under_read_ahead_is_a_storage_error_naming_the_url(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(240, 4))
    with Dataset(url, source_options={"deadline_seconds": 3.0}) as ds, \
            Loader(ds, **{**OPTIONS, "read_ahead": 2}) as loader:
        it = iter(loader)
        next(it)
        s3_server.stop()
        start = time.perf_counter()
        with pytest.raises(StorageError, match=r"s3://.*part-00\d\.tfrecord"):
            for _ in it:
                pass
    assert time.perf_counter() - start < 60


def stream_carrying(loader: Loader, chunks: int) -> list[tuple[list[int], list[bytes]]]:
    """:func:`stream`, holding the last batch back until the read-ahead has scheduled
    ``chunks`` chunks of the next epoch (it does so while the pass runs: on a loaded machine
    the pass could otherwise end before it has, and carry fewer), then their fetches."""
    out, total = [], len(loader)
    for k, b in enumerate(loader):
        out.append((b["index"].tolist(), list(b["name"])))
        if k == total - 2:
            _carried(loader, chunks)
    return out


def _carried(loader: Loader, chunks: int) -> None:
    """Wait until the pass being read has scheduled ``chunks`` chunks of the next epoch, and
    their fetches are done."""
    ahead = loader._run.read_ahead if loader._run is not None else None
    assert ahead is not None
    deadline = time.monotonic() + 30
    while ahead._carried < chunks:
        assert time.monotonic() < deadline, "the next epoch's chunks were never scheduled"
        time.sleep(0.01)
    for entry in list(ahead.session._staged.values()):
        if entry.future is not None:
            entry.future.result(timeout=30)


def test_the_next_epochs_first_batches_are_read_while_this_one_ends(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    options = {**OPTIONS, "read_ahead": 4}  # chunks: 1 batch, then 2
    expected = local_epochs(folder, 2, read_ahead=0)
    with Dataset(url) as ds, Loader(ds, **options) as loader:
        first = stream_carrying(loader, 2)
        with s3_server.stall_gets(".tfrecord", timeout_seconds=30) as stall:
            batches = iter(loader)
            # the server sends no shard byte now: these three come from the carried chunks
            head = [next(batches) for _ in range(3)]
            stall.release()
        rest = [(b["index"].tolist(), list(b["name"])) for b in batches]
    second = [(b["index"].tolist(), list(b["name"])) for b in head] + rest
    assert [first, second] == expected


def test_a_carried_read_ahead_that_does_not_fit_the_next_pass_is_dropped(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    options = {**OPTIONS, "read_ahead": 4}
    with Dataset(str(folder)) as local, Loader(local, **options) as loader:
        loader.set_epoch(5)
        expected = stream(loader)
    with Dataset(url) as ds, Loader(ds, **options) as loader:
        stream_carrying(loader, 2)  # epoch 1's first chunks, staged
        loader.set_epoch(5)
        assert stream(loader) == expected


def test_the_memory_budget_bounds_what_the_read_ahead_holds(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    options = {**OPTIONS, "read_ahead": 4}
    with Dataset(str(folder)) as local, Loader(local, **options) as loader:
        assert loader.memory_budget().read_ahead_bytes == 0  # local data: no look-ahead
    with Dataset(url) as ds, Loader(ds, **{**options, "read_ahead": 0}) as loader:
        assert loader.memory_budget().read_ahead_bytes == 0
    with Dataset(url) as ds, Loader(ds, **options) as loader:
        budget = loader.memory_budget()
        largest = max(len(p) for p in ds.read_payloads(range(240)))
        peak = 0
        for _ in range(2):
            for _batch in loader:
                assert loader._run is not None and loader._run.read_ahead is not None
                peak = max(peak, len(loader._run.read_ahead.session._staged))
    assert peak > 8  # records were staged ahead of their batches
    assert peak * largest <= budget.read_ahead_bytes - 8 * (32 << 20)  # beside the fetches
    assert budget.total_bytes >= budget.read_ahead_bytes


def digest(batch: dict[str, Any]) -> list[tuple[str, bytes]]:
    """Every feature of a batch as bytes (arrays) or their repr (lists)."""
    return [(k, v.tobytes() if hasattr(v, "tobytes") else repr(v).encode())
            for k, v in sorted(batch.items())]


def test_windows_and_patches_over_a_cached_bucket_read_what_local_files_give(
    s3_server: Any, tmp_path: Path
) -> None:
    """Frames of windows and images of patches are read ahead and cached like records: the
    batches equal local ones, and a second epoch sends no request for shard bytes."""
    import numpy as np
    import simplejpeg

    from shardfeed import Patches, Windows
    from shardfeed.format.writer import ShardWriter
    from shardfeed.tools.index import index_files

    folder = tmp_path / "frames"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(2):
        with ShardWriter(str(folder / f"frames-{k:02d}.tfrecord")) as writer:
            for i in range(k * 30, k * 30 + 30):
                pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
                writer.write_example({"image/encoded": simplejpeg.encode_jpeg(pixels),
                                      "index": [i], "day": [i // 12], "t": [float(i)]})
    index_files(str(folder), group_key="day", order_key="t")
    url = s3_server.upload_folder(folder)
    samplers: dict[str, Callable[[Dataset], Any]] = {
        "windows": lambda ds: Windows(ds, length=3, stride=2),
        "patches": lambda ds: Patches(ds, size=8, cache_images=3, refresh_every=4),
    }
    for name, make in samplers.items():
        options = {"batch_size": 4, "seed": 7, "num_threads": 2, "read_ahead": 4}

        with Dataset(str(folder)) as local, Loader(make(local), **options) as loader:
            expected = [[digest(b) for b in loader] for _ in range(2)]
        s3_server.clear_log()
        with Dataset(url, cache_dir=tmp_path / f"cache-{name}") as ds, \
                Loader(make(ds), **options) as loader:
            first = [digest(b) for b in loader]
            assert data_gets(s3_server) > 0, name
            s3_server.clear_log()
            second = [digest(b) for b in loader]
            assert data_gets(s3_server) == 0, name  # all from the cache
            assert ds.storage_stats()["staged_hits"] > 0, name  # read ahead, not one by one
        assert [first, second] == expected, name


def test_inspect_shows_what_the_cache_holds_of_the_dataset(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shardfeed.cli.main import main

    url = s3_server.upload_folder(records_dataset(60, 3))
    cache = tmp_path / "c"
    with Dataset(url, cache_dir=cache) as ds:
        ds.read_many(list(range(20)) + [25, 41])  # all of shard 0, one of 1, one of 2
        bytes_read = sum(len(p) for p in ds.read_payloads(list(range(20)) + [25, 41]))
    bound = DiskCache(cache, max_bytes=None).summary().max_bytes
    assert main(["inspect", url, "--cache-dir", str(cache), "--json"]) == 0
    held = json.loads(capsys.readouterr().out)["cache"]
    assert [(s["records"], s["cached"]) for s in held["shards"]] == [(20, 20), (20, 1), (20, 1)]
    assert (held["records"], held["bytes"]) == (22, bytes_read)
    assert main(["inspect", url, "--cache-dir", str(cache)]) == 0
    assert "cached    22 of 60 records (37%)" in capsys.readouterr().out
    # looking does not change the folder's bound; another folder is a clear error
    assert DiskCache(cache, max_bytes=None).summary().max_bytes == bound
    assert main(["inspect", url, "--cache-dir", str(tmp_path)]) == 1
    assert "not a shardfeed cache folder" in capsys.readouterr().err


def test_records_a_chunk_reads_over_are_kept_for_the_next_chunks(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """A dataset a few chunks large: each chunk's ranges span most of every shard; the
    records of the next chunks inside them come with them, so bytes are fetched about once
    an epoch, not once a chunk (and the batches are the local ones)."""
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    shard_bytes = sum(p.stat().st_size for p in folder.glob("*.tfrecord"))
    with Dataset(url) as ds, Loader(ds, **{**OPTIONS, "read_ahead": 8}) as loader:
        assert stream(loader) == local_epochs(folder, 1, read_ahead=8)[0]
        stats = ds.storage_stats()
        chunks = -(-len(loader) // 4) + 1  # 4 batches a chunk, the first of one batch
    assert stats["staged_hits"] == 240
    # each fetch brings its chunk and the records of the CHUNKS_AHEAD (2) after it in its
    # holes: about every third chunk reads the shards (without this, 6x the bytes here)
    assert stats["bytes_fetched"] <= (chunks / 3 + 2) * shard_bytes, (stats, shard_bytes)
