"""A cache folder another local user can write, walked as users and attackers would over
S3-compatible storage (moto on 127.0.0.1): the folder is refused unless the user says it is
trusted; a planted index link is refused, never written through; entries forged the way
anyone can (the key's public digest and a CRC32C, or a MAC under a key of their own) are
fetched again, never served, and the stream is the one a local read gives."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from shardfeed import Dataset, Loader, StorageError
from shardfeed.cli.main import main
from shardfeed.storage.cache_entries import HEADER

OPTIONS = {"batch_size": 8, "shuffle": True, "seed": 3, "transform": None, "num_threads": 2,
           "rank": 0, "world_size": 1}


def stream(loader: Loader) -> list[tuple[list[int], list[bytes]]]:
    return [(b["index"].tolist(), list(b["name"])) for b in loader]


def local_stream(folder: Path, epoch: int = 0) -> list[tuple[list[int], list[bytes]]]:
    with Dataset(str(folder)) as ds, Loader(ds, **OPTIONS) as loader:
        for _ in range(epoch):
            stream(loader)
        return stream(loader)


def test_a_folder_other_users_can_write_is_refused_unless_trusted(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    folder = records_dataset(64, 2)
    url = s3_server.upload_folder(folder)
    shared = tmp_path / "scratch"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: every user may create files (and links) there
    with pytest.raises(StorageError, match=r"'.*scratch' can be written by every user.*"
                                           r"chmod o-w.*trust_cache_dir=True"):
        Dataset(url, cache_dir=shared)
    assert sorted(shared.iterdir()) == []
    expected = local_stream(folder)
    with Dataset(url, cache_dir=shared, trust_cache_dir=True) as ds, \
            Loader(ds, **OPTIONS) as loader:
        assert stream(loader) == expected
    # entries are written behind the reads: closing the Dataset lands them
    with Dataset(url, cache_dir=shared, trust_cache_dir=True) as ds:
        assert ds.cached_in(shared)["records"] == 64
    assert main(["inspect", url, "--cache-dir", str(shared), "--json"]) == 1
    capsys.readouterr()
    assert main(["inspect", url, "--cache-dir", str(shared), "--trust-cache-dir",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"]["records"] == 64


def test_a_planted_index_link_is_refused_never_written_through(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    url = s3_server.upload_folder(records_dataset(64, 2))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    target = tmp_path / "home" / "notes.db"  # where the planted link leads: not there yet
    target.parent.mkdir()
    (cache / "index.sqlite3").symlink_to(target)
    with pytest.raises(StorageError, match=r"index.sqlite3' is a symbolic link.*remove it"):
        Dataset(url, cache_dir=cache)
    assert not target.exists()


def forge(path: Path, data: bytes, how: str) -> None:
    """Rewrite entry file ``path`` to hold ``data`` with a header anyone can make."""
    key = path.name.removesuffix(".rec")
    if how == "digest-and-crc":
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        head = struct.pack("<4s16sIQ", b"SFC2", digest, google_crc32c.value(data), len(data))
    else:  # the current layout, a MAC under a key of the forger's own
        mac = hmac.new(b"f" * 32, key.encode() + b"\0" + len(data).to_bytes(8, "little") + data,
                       hashlib.sha256).digest()
        head = HEADER.pack(b"SFC3", mac, len(data))
    path.write_bytes(head + data)


@pytest.mark.parametrize("how", ["digest-and-crc", "mac-of-another-key"])
def test_forged_entries_are_fetched_again_never_served(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path, how: str
) -> None:
    folder = records_dataset(128, 2)
    url = s3_server.upload_folder(folder)
    expected = local_stream(folder)
    cache = tmp_path / "cache"
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert stream(loader) == expected
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in sorted((cache / "data").rglob("*.rec")):
        by_size[path.stat().st_size].append(path)
    group = max(by_size.values(), key=len)
    assert len(group) >= 8
    payloads = [p.read_bytes()[HEADER.size:] for p in group[:8]]
    for k, path in enumerate(group[:8]):  # each now holds its neighbour's record
        forge(path, payloads[(k + 1) % 8], how)
    with Dataset(url, cache_dir=cache) as ds, Loader(ds, **OPTIONS) as loader:
        assert [stream(loader) for _ in range(2)] == [expected, local_stream(folder, 1)]
        assert ds.storage_stats()["cache_corrupt"] == 8
