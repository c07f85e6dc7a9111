"""The Loader over a dataset on S3-compatible storage (moto on 127.0.0.1), end to end."""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardfeed import Dataset, Loader, StorageError
from shardfeed.storage import ByteCache, open_source, set_index_cache
from shardfeed.storage.remote import RemoteSource


def stream(loader: Loader, *, cut: Callable[[], None] | None = None,
           cut_after: int = 0) -> list[tuple[list[int], list[bytes]]]:
    out = []
    for k, batch in enumerate(loader):
        out.append((batch["index"].tolist(), list(batch["name"])))
        if cut is not None and k + 1 == cut_after:
            cut()
    return out


def test_loader_over_s3_survives_a_server_cut(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """The server goes down mid-epoch and comes back: the stream equals the local one.
    (Reads as batches need them: the whole of this small dataset would be read ahead before
    the cut; tests/remote/test_read_ahead.py cuts the server under the look-ahead.)"""
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    options = {"batch_size": 8, "shuffle": True, "seed": 11, "transform": None,
               "num_threads": 2, "prefetch_batches": 1, "rank": 0, "world_size": 1,
               "read_ahead": 0}
    with Dataset(str(folder)) as local_ds, Loader(local_ds, **options) as local:
        expected = stream(local)
    restarted = []
    # a retry budget far above any restart time
    patient = {"retries": 30, "backoff_seconds": 0.05, "max_backoff_seconds": 0.5}

    with Dataset(url, source_options=patient) as remote_ds, \
            Loader(remote_ds, **options) as remote:
        def cut() -> None:
            s3_server.stop()  # back once a read has failed and is being retried
            restarted.append(s3_server.start_when(
                lambda: remote_ds.storage_stats()["retries"] > 0))

        got = stream(remote, cut=cut, cut_after=5)
        retries = remote_ds.storage_stats()["retries"]
    restarted[0].join(timeout=120)
    assert got == expected  # nothing lost, nothing twice, same order
    assert sorted(i for ids, _ in got for i in ids) == list(range(240))
    assert retries > 0  # the cut was felt, and recovered from


def test_resume_over_s3_on_another_rank_count(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(60, 3))
    with Dataset(url) as ds:
        before, states = [], []
        for rank in range(3):
            with Loader(ds, batch_size=4, seed=2, transform=None, rank=rank, world_size=3,
                        remainder="drop") as loader:
                it = iter(loader)
                before += [i for _ in range(2) for i in next(it)["index"].tolist()]
                states.append(loader.state())
        assert states[0] == states[1] == states[2] and states[0]["consumed"] == 24
        after = []
        for rank in range(2):
            with Loader(ds, batch_size=4, seed=2, transform=None, rank=rank, world_size=2,
                        remainder="drop") as loader:
                loader.restore(states[0])
                after += [i for b in loader for i in b["index"].tolist()]
    assert Counter(before + after) == Counter(range(60))


def test_missing_shard_names_the_url(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(30, 2))
    with Dataset(url) as ds:
        victim = ds.shard_urls[1]
        s3_server.filesystem().rm(victim.removeprefix("s3://"))
        with Loader(ds, batch_size=30, transform=None, on_error="skip") as loader, \
                pytest.raises(StorageError, match=victim.replace(".", r"\.")) as info:
            next(iter(loader))
    assert "does not exist" in str(info.value)


def test_reads_are_ranged_and_coalesced(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(40, 2))
    with Dataset(url) as ds:
        ds.read_many([0])  # open the first shard (its index and size)
        s3_server.clear_log()
        records = ds.read_many([7, 3, 4, 5, 12])
        gets = s3_server.requests("GET")
    assert [int(r["index"][0]) for r in records] == [7, 3, 4, 5, 12]
    assert len(gets) == 1 and gets[0].range is not None  # one ranged GET for neighbours
    assert gets[0].path.endswith("part-000.tfrecord")


def test_manifest_and_index_requests(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    """Opening reads the manifest once; each shard's index is fetched once, on first use."""
    url = s3_server.upload_folder(records_dataset(40, 2))
    s3_server.clear_log()
    with Dataset(url) as ds:
        opened = Counter((r.method, r.path.rsplit("/", 1)[-1]) for r in s3_server.requests())
        for _ in range(3):
            ds.read_many(range(40))
        used = Counter((r.method, r.path.rsplit("/", 1)[-1]) for r in s3_server.requests())
    assert opened[("GET", "shardfeed.json")] == 1
    assert not [k for k in opened if k[1].endswith((".tfrecord", ".idx", ".idx.npy"))]
    for shard in ("part-000.tfrecord", "part-001.tfrecord"):
        index = [k for k in used if k[1].startswith(shard + ".idx")]
        assert index == [("GET", shard + ".idx.npy")]  # one request: no HEAD, no text index
        assert used[("GET", shard + ".idx.npy")] == 1


def test_index_cache_spares_the_second_open(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    url = s3_server.upload_folder(records_dataset(40, 2))
    cache = ByteCache(max_bytes=1 << 20)
    set_index_cache(cache)
    try:
        with Dataset(url) as ds:
            first = ds.read_many(range(40))
        s3_server.clear_log()
        with Dataset(url) as ds:
            again = ds.read_many(range(40))
        index_gets = [r for r in s3_server.requests("GET") if ".idx" in r.path]
    finally:
        set_index_cache(None)
    assert [r["name"] for r in again] == [r["name"] for r in first]
    assert index_gets == [] and len(cache) == 2
    assert cache.size_bytes == 2 * 8 * 21 + 2 * 128  # 20 records a shard + end, .npy headers
    with pytest.raises(TypeError, match="ByteCache"):
        set_index_cache({})  # type: ignore[arg-type]


def test_open_source_forwards_options(s3_server: Any, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3_server.upload_folder(_one_file(tmp_path))
    for obstore in ("1", "0"):  # the default backend where installed, then fsspec's
        if obstore == "0" and importlib.util.find_spec("s3fs") is None:
            continue  # fsspec's road to S3 is s3fs's
        monkeypatch.setenv("SHARDFEED_OBSTORE", obstore)
        with open_source(url + "/blob.bin", max_concurrency=3, coalesce_gap_bytes=0,
                         retries=1) as src:
            if obstore == "0":
                assert isinstance(src, RemoteSource)
                assert src.max_concurrency == 3
            assert (src.coalesce_gap_bytes, src.policy.retries) == (0, 1)
            assert src.read_ranges([(0, 4), (10, 2)]) == [bytes(range(4)), bytes([10, 11])]
    with pytest.raises(TypeError, match="apply to URLs"):
        open_source(tmp_path / "blob" / "blob.bin", max_concurrency=3)


def _one_file(tmp_path: Path) -> Path:
    folder = tmp_path / "blob"
    folder.mkdir()
    (folder / "blob.bin").write_bytes(np.arange(64, dtype=np.uint8).tobytes())
    return folder
