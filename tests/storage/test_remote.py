"""RemoteSource against a real S3-compatible server on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from s3_fixture import S3Server

from shardfeed.errors import StorageError
from shardfeed.storage import LocalSource, open_source
from shardfeed.storage.cache import ByteCache
from shardfeed.storage.remote import RemoteSource, set_storage_options, storage_options_for


@pytest.fixture(autouse=True)
def _s3fs_reads_s3_here(request: pytest.FixtureRequest) -> None:
    """RemoteSource on s3:// is fsspec's road to S3: s3fs's (tests without a server run
    anyway)."""
    if {"hostile_server", "s3_server"} & set(request.fixturenames):
        pytest.importorskip("s3fs")


SIZE = 300_000


@pytest.fixture()
def shard(s3_server: S3Server, tmp_path: Path) -> tuple[str, Path]:
    """The same 300 KB of bytes as a local file and as an S3 object."""
    local = tmp_path / "shard.tfrecord"
    local.write_bytes(np.random.default_rng(7).bytes(SIZE))
    bucket = s3_server.new_bucket("remote")
    url = f"s3://{bucket}/data/shard.tfrecord"
    s3_server.filesystem().put_file(str(local), url)
    s3_server.clear_log()
    return url, local


def random_ranges(rng: np.random.Generator, count: int) -> list[tuple[int, int]]:
    offsets = rng.integers(0, SIZE + 100, size=count)
    lengths = rng.integers(0, 20_000, size=count)
    return [(int(o), int(n)) for o, n in zip(offsets, lengths)]


@pytest.mark.parametrize("gap", [-1, 0, 4096, 1 << 20])
def test_reads_equal_local_bytes(shard: tuple[str, Path], gap: int) -> None:
    url, local = shard
    rng = np.random.default_rng(gap + 2)
    ranges = random_ranges(rng, 120) + [(SIZE - 10, 50), (SIZE, 5), (0, 0)]
    with RemoteSource(url, coalesce_gap_bytes=gap, max_concurrency=8) as remote, \
            LocalSource(local) as expected:
        assert remote.size() == SIZE
        assert remote.read_ranges(ranges) == expected.read_ranges(ranges)
        for offset, length in ranges[:15]:
            assert remote.read(offset, length) == expected.read(offset, length)


def test_concurrent_callers_get_their_own_bytes(shard: tuple[str, Path]) -> None:
    url, local = shard
    expected = local.read_bytes()
    failures: list[str] = []
    remote = RemoteSource(url, max_concurrency=4)

    def work(seed: int) -> None:
        ranges = random_ranges(np.random.default_rng(seed), 40)
        got = remote.read_ranges(ranges)
        if got != [expected[o : o + n] for o, n in ranges]:
            failures.append(f"thread {seed}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    remote.close()
    assert failures == []


def test_coalescing_turns_neighbouring_records_into_one_request(
    s3_server: S3Server, shard: tuple[str, Path]
) -> None:
    url, local = shard
    # 50 records of 1,000 bytes, back to back, asked in shuffled order
    ranges = [(1000 * i, 1000) for i in np.random.default_rng(3).permutation(50).tolist()]
    expected = LocalSource(local).read_ranges(ranges)

    with RemoteSource(url, coalesce_gap_bytes=-1) as separate:
        assert separate.read_ranges(ranges) == expected
    uncoalesced = len(s3_server.requests("GET"))
    s3_server.clear_log()
    with RemoteSource(url, coalesce_gap_bytes=0) as merged:
        assert merged.read_ranges(ranges) == expected
        assert merged.stats()["requests"] == 1
    coalesced = s3_server.requests("GET")
    assert uncoalesced == 50
    assert len(coalesced) == 1 and coalesced[0].range == "bytes=0-49999"


def test_max_request_bytes_caps_merged_requests(s3_server: S3Server, shard: tuple[str, Path]) -> None:
    url, local = shard
    ranges = [(1000 * i, 1000) for i in range(50)]
    with RemoteSource(url, max_request_bytes=10_000) as remote:
        assert remote.read_ranges(ranges) == LocalSource(local).read_ranges(ranges)
    assert len(s3_server.requests("GET")) == 5


def test_size_is_one_head_and_remembered(s3_server: S3Server, shard: tuple[str, Path]) -> None:
    url, _ = shard
    remote = RemoteSource(url)
    assert remote.size() == remote.size() == SIZE
    assert len(s3_server.requests("HEAD")) == 1
    assert s3_server.requests("GET") == []


@pytest.mark.parametrize("which", ["bucket", "key"])
def test_missing_bucket_or_key_is_storage_error_naming_the_url(
    s3_server: S3Server, shard: tuple[str, Path], which: str
) -> None:
    url, _ = shard
    bad = "s3://no-such-bucket-xyz/data/shard.tfrecord" if which == "bucket" else url + ".nope"
    remote = RemoteSource(bad, backoff_seconds=0.01)
    with pytest.raises(StorageError) as info:
        remote.read(0, 10)
    assert bad in str(info.value) and "does not exist" in str(info.value)
    assert "bucket" in str(info.value) and "check" in str(info.value)
    with pytest.raises(StorageError, match="does not exist"):
        remote.size()
    assert remote.stats()["retries"] == 0  # permanent: no retry


def test_open_source_uses_registered_options(shard: tuple[str, Path]) -> None:
    url, local = shard
    source = open_source(url)  # obstore where installed (the default), else fsspec
    assert type(source).__name__ in ("ObstoreSource", "RemoteSource")
    assert source.read(1234, 100) == local.read_bytes()[1234:1334]
    source.close()


def test_registry_longer_prefixes_and_explicit_options_win() -> None:
    set_storage_options("gs://", project="p0", token="anon")
    set_storage_options("gs://bucket/", project="p1")
    try:
        assert storage_options_for("gs://bucket/x") == {"project": "p1", "token": "anon"}
        assert storage_options_for("gs://other/x") == {"project": "p0", "token": "anon"}
        assert storage_options_for("gs://bucket/x", {"project": "p2"})["project"] == "p2"
        assert storage_options_for("az://bucket/x") == {}
    finally:
        set_storage_options("gs://")
        set_storage_options("gs://bucket/")
    with pytest.raises(ValueError, match="URL prefix"):
        set_storage_options("bucket", anon=True)


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL"])
def test_endpoint_from_environment(
    s3_server: S3Server, shard: tuple[str, Path], variable: str
) -> None:
    """What users do: point s3fs at a private endpoint with an environment variable."""
    url, local = shard
    env = {k: v for k, v in os.environ.items() if "ENDPOINT" not in k}
    env[variable] = s3_server.endpoint_url
    code = (
        "from shardfeed.storage import open_source\n"
        f"print(open_source({url!r}).read(10, 8).hex())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == local.read_bytes()[10:18].hex()


# A retry budget far above any restart time (about 13 s of waiting at least). The server
# comes back only once the source's own retrier has seen a failure: s3fs's own retries of a
# dropped connection (about 2 s) all fail first, so the recovery is always the source's.
PATIENT = {"retries": 30, "backoff_seconds": 0.05, "max_backoff_seconds": 0.5}


def test_cut_server_mid_read_recovers_with_identical_bytes(
    s3_server: S3Server, shard: tuple[str, Path]
) -> None:
    url, local = shard
    expected = local.read_bytes()
    slots = np.random.default_rng(11).permutation(SIZE // 700)[:400]
    ranges = [(700 * int(k), 500) for k in slots]  # 400 separate requests
    remote = RemoteSource(url, coalesce_gap_bytes=-1, max_concurrency=4, **PATIENT)
    result: list[list[bytes]] = []
    errors: list[Exception] = []

    def read() -> None:
        try:
            result.append(remote.read_ranges(ranges))
        except Exception as exc:  # noqa: BLE001 - re-raised in the test thread below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 60
    while len(s3_server.requests("GET")) < 40 and time.monotonic() < deadline:
        time.sleep(0.002)
    s3_server.stop()
    # back once the cut was felt, however long that takes on a loaded machine
    restart = s3_server.start_when(lambda: remote.stats()["retries"] > 0)
    reader.join(timeout=120)
    restart.join(timeout=120)
    remote.close()
    assert not reader.is_alive() and not errors, errors
    assert result and result[0] == [expected[o : o + n] for o, n in ranges]
    assert remote.stats()["retries"] > 0
    assert len(s3_server.requests("GET")) >= 400  # every range was fetched, some twice


def test_refused_connections_recover_when_server_returns(
    s3_server: S3Server, shard: tuple[str, Path]
) -> None:
    url, local = shard
    with RemoteSource(url, **PATIENT) as remote:
        remote.size()
        s3_server.stop()
        restart = s3_server.start_when(lambda: remote.stats()["retries"] >= 2)
        assert remote.read(5000, 300) == local.read_bytes()[5000:5300]
        restart.join(timeout=120)
        assert remote.stats()["retries"] >= 2  # refused twice, then served


@pytest.mark.timeout(60)
def test_server_that_stays_down_gives_storage_error_after_the_budget(
    s3_server: S3Server, shard: tuple[str, Path]
) -> None:
    url, _ = shard
    with RemoteSource(url, retries=3, backoff_seconds=0.05, max_backoff_seconds=0.2) as remote:
        s3_server.stop()
        with pytest.raises(StorageError) as info:
            remote.read_ranges([(0, 10), (100_000, 10)])
        assert remote.stats()["retries"] >= 3
    message = str(info.value)
    assert url in message and "after 4 attempts" in message and "endpoint" in message


def test_whole_file_cache_fetches_small_objects_once(
    s3_server: S3Server, shard: tuple[str, Path]
) -> None:
    url, local = shard
    cache = ByteCache(max_bytes=1 << 20)
    remote = RemoteSource(url, cache=cache)
    ranges = random_ranges(np.random.default_rng(5), 30)
    assert remote.read_ranges(ranges) == LocalSource(local).read_ranges(ranges)
    assert remote.read(77, 3) == local.read_bytes()[77:80]
    again = RemoteSource(url, cache=cache)
    assert again.read(0, 10) == local.read_bytes()[:10]
    assert len(s3_server.requests("GET")) == 1 and cache.size_bytes == SIZE
    too_small = ByteCache(max_bytes=1 << 20, max_item_bytes=1000)
    RemoteSource(url, cache=too_small).read(0, 10)
    assert len(too_small) == 0  # larger than max_item_bytes: read by range instead


def test_memory_filesystem_and_close(tmp_path: Path) -> None:
    import fsspec

    url = f"memory://{tmp_path.name}/x.bin"
    with fsspec.open(url, "wb") as handle:
        handle.write(b"0123456789")
    remote = RemoteSource(url)
    assert remote.read_ranges([(8, 5), (0, 2), (3, 0)]) == [b"89", b"01", b""]
    remote.close()
    remote.close()
    with pytest.raises(StorageError, match="closed"):
        remote.read_ranges([(0, 1), (5, 1)])


@pytest.mark.parametrize(
    "kwargs",
    [{"max_concurrency": 0}, {"coalesce_gap_bytes": -2}, {"max_request_bytes": 0},
     {"retries": -1}, {"backoff_seconds": -1.0}],
)
def test_bad_options_fail_at_construction(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        RemoteSource("memory://x/y", **kwargs)  # type: ignore[arg-type]


def test_bad_ranges_are_value_errors() -> None:
    remote = RemoteSource("memory://x/y")
    with pytest.raises(ValueError, match="offset"):
        remote.read(-1, 4)
    with pytest.raises(ValueError, match="length"):
        remote.read_ranges([(0, -4)])
