"""``inspect`` and ``verify`` on datasets in object storage: moto S3 on 127.0.0.1 and memory://.

They open a URL the way ``Dataset`` does and read the shards through the same byte sources,
so they see the records ``Dataset`` reads, and name a damaged remote record by shard and
offset.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import simplejpeg

from shardfeed import Dataset
from shardfeed.cli.main import main
from shardfeed.errors import FormatError
from shardfeed.tools.inspect import inspect
from shardfeed.tools.pack import pack
from shardfeed.tools.verify import report as V
from shardfeed.tools.verify import verify

BAD_SHARD = "shard-00001-of-00004.tfrecord"


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local dataset: 10 JPEGs in two classes, 3 records a shard (4 shards)."""
    base = tmp_path_factory.mktemp("packed")
    rng = np.random.default_rng(11)
    for name in ("cat", "dog"):
        (base / "photos" / name).mkdir(parents=True)
        for i in range(5):
            pixels = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
            (base / "photos" / name / f"{i}.jpg").write_bytes(simplejpeg.encode_jpeg(pixels))
    pack(base / "photos", base / "ds", records_per_shard=3)
    return base / "ds"


def _damaged(packed: Path) -> tuple[bytes, int]:
    """BAD_SHARD with one byte of its record 1 flipped, and that record's offset."""
    offsets = np.load(packed / (BAD_SHARD + ".idx.npy"))
    data = bytearray((packed / BAD_SHARD).read_bytes())
    data[int(offsets[1]) + 40] ^= 0xFF  # inside record 1's image bytes
    return bytes(data), int(offsets[1])


@pytest.fixture
def memory_url(packed: Path) -> Iterator[str]:
    """The dataset copied to a fresh memory:// folder."""
    fs = fsspec.filesystem("memory")
    root = f"/verify-{uuid.uuid4().hex[:8]}/ds"
    for path in packed.iterdir():
        fs.pipe_file(f"{root}/{path.name}", path.read_bytes())
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


def _check_both_ways(
    url: str, put: Callable[[str, bytes], None], packed: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """inspect and verify (Python and CLI) on the dataset at ``url``, then with a damaged
    record uploaded in place of BAD_SHARD."""
    with Dataset(url) as ds:
        assert len(ds) == 10
    info = inspect(url, records=2)
    assert info["records"] == 10 and len(info["shards"]) == 4 and info["bytes"] > 0
    assert info["manifest"] == url + "/shardfeed.json" and len(info["first_records"]) == 2
    assert inspect(url + "/*.tfrecord")["records"] == 10  # bare files: offsets from indexes
    report = verify(url, decode=True, workers=2)
    assert report.ok, report.problems
    assert (report.records, len(report.shards), report.to_json()["decoded"]) == (10, 4, 10)
    assert main(["inspect", url]) == 0
    assert "records   10 in 4 shards" in capsys.readouterr().out
    assert main(["verify", url, "--no-progress"]) == 0
    assert "ok: 10 records in 4 shards" in capsys.readouterr().out

    data, offset = _damaged(packed)
    put(f"{url}/{BAD_SHARD}", data)
    report = verify(url)
    shard_url = f"{url}/{BAD_SHARD}"
    found = [(p.kind, p.path, p.record, p.offset) for p in report.problems]
    assert (V.BAD_DATA_CRC, shard_url, 1, offset) in found
    assert V.CHECKSUM_MISMATCH in [p.kind for p in report.problems]
    assert main(["verify", url, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"file '{shard_url}', record 1 at byte {offset}: bad data CRC" in out
    assert "FAILED" in out


def test_inspect_and_verify_on_s3(
    s3_server: Any, packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3_server.upload_folder(packed)
    fs = s3_server.filesystem()
    _check_both_ways(url, lambda u, data: fs.pipe_file(u.removeprefix("s3://"), data), packed,
                     capsys)


def test_inspect_and_verify_on_memory_filesystem(
    memory_url: str, packed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = fsspec.filesystem("memory")
    _check_both_ways(memory_url, lambda u, data: fs.pipe_file(u.removeprefix("memory://"), data),
                     packed, capsys)


def test_verify_reports_a_missing_remote_shard(s3_server: Any, packed: Path) -> None:
    url = s3_server.upload_folder(packed)
    s3_server.filesystem().rm(f"{url.removeprefix('s3://')}/{BAD_SHARD}")
    report = verify(url)
    assert [(p.kind, p.path) for p in report.problems] == [(V.MISSING_FILE, f"{url}/{BAD_SHARD}")]
    assert report.records == 7


class _Stop(Exception):
    """Stands for the crash of a pack part-way through its upload."""


def test_interrupted_pack_to_s3_is_refused(s3_server: Any, packed: Path) -> None:
    """A pack into a bucket that stopped after two of its four shards: no manifest, its plan
    file there, and the shard names say four. Every reader refuses it; the files named one
    by one too."""
    url = f"s3://{s3_server.new_bucket()}/ds"
    uploaded: list[str] = []

    def stop_after_two(path: str) -> None:
        uploaded.append(path)
        if len(uploaded) == 2:
            raise _Stop

    with pytest.raises(_Stop):
        pack(packed.parent / "photos", url, records_per_shard=3, on_shard=stop_after_two)
    names = sorted(n.rsplit("/", 1)[-1] for n in s3_server.filesystem().ls(url[5:]))
    assert [n for n in names if n.endswith(".tfrecord")] == [
        "shard-00000-of-00004.tfrecord", "shard-00001-of-00004.tfrecord"]
    # the plan file went up first: the prefix says a pack did not finish, and how to redo it
    refused = r"holds a pack that did not finish .*2 of 4 shards written.*--overwrite"
    for source in (url, url + "/*.tfrecord", [f"{url}/shard-00000-of-00004.tfrecord"]):
        with pytest.raises(FormatError, match=refused):
            Dataset(source)  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=refused):
        verify(url)
    with pytest.raises(FormatError, match=refused):
        inspect(url)
    assert main(["verify", url, "--no-progress"]) == 1
    with Dataset(url, allow_partial=True) as partial:
        assert len(partial) == 6
