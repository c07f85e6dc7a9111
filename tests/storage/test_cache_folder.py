"""What a cache folder trusts (storage/cache_folder.py), walked as another local user would
attack it: a planted index link, forged entries, a folder others can write or another user
owns, a key others can read; and what the cache makes: files only its users can read."""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import stat
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import pytest

from shardfeed import ShardfeedError, StorageError
from shardfeed.cli.main import main
from shardfeed.storage.disk_cache import DiskCache


def value(key: str) -> bytes:
    return key.encode() * 25


def put(cache: DiskCache, keys: list[str]) -> None:
    assert cache.put_many([(k, "s3://b/shard", value(k), 5) for k in keys]) == len(keys)


def entry(folder: Path, key: str) -> Path:
    return folder / "data" / key[:2] / f"{key}.rec"


@pytest.fixture()
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # the usual umask: files 0644, readable by every user
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("name", ["index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm"])
def test_a_planted_index_link_is_refused_never_written_through(
    tmp_path: Path, name: str
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.log"
    victim.write_bytes(b"")  # a file of the user's, empty: SQLite would make it an index
    (folder / name).symlink_to(victim)
    missing = tmp_path / "made-by-the-cache"
    (folder / "index.sqlite3-journal").symlink_to(missing)  # a link to create a file
    with pytest.raises(StorageError, match=r"is a symbolic link.*never writes through links"):
        DiskCache(folder, max_bytes=10_000)
    assert victim.read_bytes() == b""
    assert not missing.exists()
    if name == "index.sqlite3":  # looked at: refused as well
        with pytest.raises(StorageError, match="symbolic link"):
            DiskCache.existing(folder)
        assert main(["cache", str(folder)]) == 1
    assert victim.read_bytes() == b""


def test_a_hard_linked_index_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    DiskCache(folder, max_bytes=10_000).close()
    os.link(folder / "index.sqlite3", tmp_path / "elsewhere.db")
    with pytest.raises(StorageError, match="hard links"):
        DiskCache(folder, max_bytes=10_000)


def forged_v2(key: str, data: bytes) -> bytes:
    """An entry made as anyone can: the key's unkeyed digest and the bytes' CRC32C."""
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return struct.pack("<4s16sIQ", b"SFC2", digest, google_crc32c.value(data), len(data)) + data


def forged_v3(key: str, data: bytes) -> bytes:
    """The current layout, with a MAC under a key of the forger's own."""
    mac = hmac.new(b"k" * 32, key.encode() + b"\0" + len(data).to_bytes(8, "little") + data,
                   hashlib.sha256).digest()
    return struct.pack("<4s32sQ", b"SFC3", mac, len(data)) + data


def test_forged_entries_are_fetched_again_never_served(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", max_bytes=10_000)
    keys = ["aaa1", "bbb1", "ccc1"]
    put(cache, keys)
    other = DiskCache(tmp_path / "other", max_bytes=10_000)  # another cache: another key
    put(other, ["ccc1"])
    evil = b"evil" * 25  # the same length as the record
    entry(tmp_path / "c", "aaa1").write_bytes(forged_v2("aaa1", evil))
    entry(tmp_path / "c", "bbb1").write_bytes(forged_v3("bbb1", evil))
    entry(tmp_path / "c", "ccc1").write_bytes(entry(tmp_path / "other", "ccc1").read_bytes())
    assert cache.get_many(keys) == [None, None, None]  # misses: the caller fetches them
    assert cache.counters.corrupt == 3
    assert not any(entry(tmp_path / "c", k).exists() for k in keys)
    put(cache, keys)
    assert cache.get_many(keys) == [value(k) for k in keys]


def modes(folder: Path) -> dict[str, int]:
    out = {}
    for path in [folder, *folder.rglob("*")]:
        kind = "dir" if path.is_dir() else "file"
        out[f"{kind} {path.relative_to(folder)}"] = stat.S_IMODE(path.stat().st_mode)
    return out


def test_files_are_private_whatever_the_umask(tmp_path: Path, umask_022: None) -> None:
    folder = tmp_path / "c"
    cache = DiskCache(folder, max_bytes=10_000)
    put(cache, ["abc1"])
    assert cache.reserve([("def1", "s3://b/shard", 5, 5)], now=0) == [True]  # a lock file
    found = modes(folder)
    assert {m for name, m in found.items() if name.startswith("file")} == {0o600}, found
    assert {m for name, m in found.items() if name.startswith("dir")} == {0o700}, found
    assert "file key" in found and "file index.sqlite3-wal" in found


def test_a_group_folder_is_shared_with_its_group(tmp_path: Path, umask_022: None) -> None:
    folder = tmp_path / "team"
    folder.mkdir()
    os.chmod(folder, 0o2770)  # chgrp team; chmod 2770: the members write it
    cache = DiskCache(folder, max_bytes=10_000)
    put(cache, ["abc1"])
    assert cache.reserve([("def1", "s3://b/shard", 5, 5)], now=0) == [True]
    found = modes(folder)
    index = {n: m for n, m in found.items() if n.startswith("file index.sqlite3")}
    assert set(index.values()) == {0o660}, index
    files = {n: m for n, m in found.items() if n.startswith("file") and n not in index}
    assert set(files.values()) == {0o640}, files
    dirs = {n: m & 0o777 for n, m in found.items() if n.startswith("dir") and n != "dir ."}
    assert set(dirs.values()) == {0o770}, dirs


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o733])
def test_a_folder_other_users_can_write_is_refused_unless_trusted(
    tmp_path: Path, mode: int, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(StorageError, match=r"written by every user.*trust_cache_dir=True"):
        DiskCache(folder, max_bytes=10_000)
    assert not (folder / "index.sqlite3").exists()  # nothing made there
    assert main(["cache", str(folder)]) == 1
    cache = DiskCache(folder, max_bytes=10_000, trust_folder=True)  # the user says so
    put(cache, ["abc1"])
    assert cache.get_many(["abc1"]) == [value("abc1")]
    assert main(["cache", str(folder), "--trust-cache-dir"]) == 0
    assert "1 entries" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused_unless_trusted(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, 65534, 65534)  # nobody's
    with pytest.raises(StorageError, match=r"belongs to another user \(uid 65534\)"):
        DiskCache(folder, max_bytes=10_000)
    put(DiskCache(folder, max_bytes=10_000, trust_folder=True), ["abc1"])


def test_a_key_others_can_read_or_a_linked_key_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    put(DiskCache(folder, max_bytes=10_000), ["abc1"])
    os.chmod(folder / "key", 0o644)
    with pytest.raises(StorageError, match=r"key file .* can be read or written by other"):
        DiskCache(folder, max_bytes=10_000)
    os.chmod(folder / "key", 0o600)
    os.replace(folder / "key", tmp_path / "key")
    (folder / "key").symlink_to(tmp_path / "key")
    with pytest.raises(StorageError, match="symbolic link there is never followed"):
        DiskCache(folder, max_bytes=10_000)
    (folder / "key").unlink()
    (folder / "key").write_bytes(b"short")
    os.chmod(folder / "key", 0o600)
    with pytest.raises(ShardfeedError, match="holds 5 bytes, not 32"):
        DiskCache(folder, max_bytes=10_000)


def test_a_cache_without_its_key_refetches_its_entries(tmp_path: Path) -> None:
    """A key removed (or a folder made before keys): no error; every entry is fetched again
    once and kept again."""
    folder = tmp_path / "c"
    put(DiskCache(folder, max_bytes=10_000), ["abc1", "def1"])
    (folder / "key").unlink()
    cache = DiskCache(folder, max_bytes=10_000)
    assert cache.get_many(["abc1", "def1"]) == [None, None]
    put(cache, ["abc1", "def1"])
    assert DiskCache(folder, max_bytes=10_000).get_many(["abc1"]) == [value("abc1")]


def test_a_folder_of_the_unkeyed_format_is_emptied_when_opened(tmp_path: Path) -> None:
    """As the previous shardfeed left it: format 2, no key, its entries and the temp files of
    writers killed mid-write in the entry folders."""
    folder = tmp_path / "c"
    put(DiskCache(folder, max_bytes=10_000), ["abc1"])
    (folder / "key").unlink()
    entry(folder, "abc1").write_bytes(forged_v2("abc1", value("abc1")))
    (folder / "data" / "ab" / "abc2.rec.tmp-4242-1").write_bytes(b"x" * 5000)
    db = sqlite3.connect(folder / "index.sqlite3")
    db.execute("UPDATE meta SET value=2 WHERE name='format'")
    db.commit()
    db.close()
    cache = DiskCache(folder, max_bytes=10_000)
    assert cache.summary().entries == 0
    assert [p for p in (folder / "data").rglob("*") if p.is_file()] == []
    put(cache, ["abc1"])
    assert cache.get_many(["abc1"]) == [value("abc1")]


def test_fifos_and_folders_in_the_cache_s_places_neither_block_nor_break_it(
    tmp_path: Path
) -> None:
    """Found by the fuzz target: a FIFO where a dead holder's temp folder was (opening it for
    reading would wait for a writer forever), a folder where an entry's file was."""
    folder = tmp_path / "c"
    put(DiskCache(folder, max_bytes=10_000), ["abc1", "def1"])
    (folder / "tmp").mkdir(exist_ok=True)
    os.mkfifo(folder / "tmp" / "0123456789abcdef")
    (folder / "locks" / "0123456789abcdef.lock").write_bytes(b"")  # its holder: dead
    entry(folder, "abc1").unlink()
    (entry(folder, "abc1") / "sub").mkdir(parents=True)
    code = ("import sys; from shardfeed.storage.disk_cache import DiskCache; "
            "c = DiskCache(sys.argv[1], max_bytes=10_000); print(c.verify(), c.summary().entries)")
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.split() == ["['abc1']", "1"]
    assert not (folder / "tmp" / "0123456789abcdef").exists()
    cache = DiskCache(folder, max_bytes=10_000)
    put(cache, ["abc1"])
    assert cache.get_many(["abc1", "def1"]) == [value("abc1"), value("def1")]
