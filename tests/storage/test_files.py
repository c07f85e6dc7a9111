"""storage.files on local paths, memory:// and s3:// (a real S3-compatible server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from s3_fixture import S3Server

from shardfeed.errors import StorageError
from shardfeed.storage import files
from shardfeed.storage.cache import ByteCache


@pytest.fixture(params=["local", "file-url", "memory", "s3"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    kind = request.param
    if kind == "local":
        return str(tmp_path / "root")
    if kind == "file-url":
        return f"file://{tmp_path}/root"
    if kind == "memory":
        return f"memory://{tmp_path.name}/root"
    server: S3Server = request.getfixturevalue("s3_server")
    return f"s3://{server.new_bucket('files')}/root"


def test_write_read_size_exists_listdir_glob(base: str) -> None:
    files.makedirs(base)
    a = files.join(base, "a.tfrecord")
    b = files.join(base, "sub", "b.tfrecord")
    files.write_bytes_atomic(a, b"alpha")
    files.write_bytes_atomic(b, memoryview(b"beta!!"))
    assert files.read_bytes(a) == b"alpha"
    assert files.size(b) == 6
    assert files.exists(a) and not files.exists(files.join(base, "missing"))
    assert files.listdir(base) == ["a.tfrecord", "sub"]
    found = files.glob(files.join(base, "**", "*.tfrecord"))
    assert [f.rsplit("/", 1)[-1] for f in found] == ["a.tfrecord", "b.tfrecord"]
    assert all(files.read_bytes(f) in (b"alpha", b"beta!!") for f in found)


def test_overwrite_rename_remove(base: str) -> None:
    src = files.join(base, "x.json")
    dst = files.join(base, "y.json")
    files.write_bytes_atomic(src, b"old")
    files.write_bytes_atomic(src, b"new")
    assert files.read_bytes(src) == b"new"
    files.write_bytes_atomic(dst, b"to be replaced")
    files.rename(src, dst)
    assert files.read_bytes(dst) == b"new" and not files.exists(src)
    files.remove(dst)
    assert not files.exists(dst)
    files.remove(dst, missing_ok=True)
    with pytest.raises(StorageError, match="y.json"):
        files.remove(dst)


def test_upload_file_atomic(base: str, tmp_path: Path) -> None:
    local = tmp_path / "shard.bin"
    local.write_bytes(bytes(range(256)) * 1000)
    target = files.join(base, "up", "shard.bin")
    files.upload_file_atomic(local, target)
    assert files.read_bytes(target) == local.read_bytes()


def test_missing_file_is_storage_error_naming_it(base: str) -> None:
    missing = files.join(base, "nope", "gone.idx")
    for call in (files.read_bytes, files.size):
        with pytest.raises(StorageError, match="gone.idx") as info:
            call(missing)
        assert "does not exist" in str(info.value)


def test_local_atomic_write_leaves_no_temp_and_keeps_old_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    files.write_bytes_atomic(target, b"v1")

    with pytest.raises(TypeError):
        files.write_bytes_atomic(target, 12345)  # type: ignore[arg-type]
    assert target.read_bytes() == b"v1"
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_local_paths_never_import_fsspec(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from shardfeed.storage import files\n"
        f"p = {str(tmp_path / 'f.bin')!r}\n"
        "files.write_bytes_atomic(p, b'x'); files.read_bytes(p); files.glob(p + '*')\n"
        f"files.exists(p); files.size(p); files.listdir({str(tmp_path)!r})\n"
        "print('fsspec' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_join_keeps_url_separators() -> None:
    assert files.join("s3://bucket/ds/", "a", "b.idx") == "s3://bucket/ds/a/b.idx"
    assert files.join("s3://bucket") == "s3://bucket"
    assert files.join("data", "x") == os.path.join("data", "x")


def test_rename_across_local_and_remote_is_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="upload_file_atomic"):
        files.rename(tmp_path / "a", "s3://bucket/a")


def test_read_bytes_cache_serves_repeats_and_writes_invalidate(s3_server: S3Server) -> None:
    url = f"s3://{s3_server.new_bucket('cache')}/m.json"
    cache = ByteCache(max_bytes=1 << 20)
    files.write_bytes_atomic(url, b"one", cache=cache)
    s3_server.clear_log()
    assert files.read_bytes(url, cache=cache) == b"one"
    assert files.read_bytes(url, cache=cache) == b"one"
    assert len(s3_server.requests("GET")) == 1
    files.write_bytes_atomic(url, b"two", cache=cache)
    assert files.read_bytes(url, cache=cache) == b"two"


def test_s3_missing_bucket_is_storage_error(s3_server: S3Server) -> None:
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/x.*does not exist"):
        files.read_bytes("s3://no-such-bucket-here/x")


def test_atomic_write_gives_the_mode_of_a_plain_open(tmp_path: Path) -> None:
    import os
    import stat

    from shardfeed.storage import files

    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    atomic = tmp_path / "atomic"
    files.write_bytes_atomic(str(atomic), b"x")
    assert stat.S_IMODE(os.stat(atomic).st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_create_bytes_writes_only_a_new_name(base: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    files.makedirs(base)
    if base.startswith("memory://"):  # fsspec's backend: no conditional write, said so
        with pytest.raises(StorageError, match="no conditional write"):
            files.create_bytes(files.join(base, "v.json"), b"one")
        return
    target = files.join(base, "v.json")

    def attempt(k: int) -> bool:
        try:
            files.create_bytes(target, f"writer {k}".encode())
        except FileExistsError:
            return False
        return True

    with ThreadPoolExecutor(4) as pool:  # of writers at once, exactly one succeeds
        won = list(pool.map(attempt, range(4)))
    assert won.count(True) == 1
    assert files.read_bytes(target) == f"writer {won.index(True)}".encode()
    with pytest.raises(FileExistsError):
        files.create_bytes(target, b"again")
    assert [n for n in files.listdir(base) if n.rstrip("/").rsplit("/", 1)[-1] != "v.json"] == []
