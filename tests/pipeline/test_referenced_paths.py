"""Referenced records name images inside the dataset's root; a hostile path is refused.

The layout is the one ``pack --mode referenced`` makes (``data/photos`` beside ``data/ds``,
the root stored as ``../photos``); a downloaded dataset's records then name a private file of
the user's: by ``../``, by absolute path, by ``file://`` URL, by ``http://`` URL or through a
link. The Loader refuses each, naming the shard and record, and its message never holds the
file's bytes; ``on_error="skip"`` replaces such samples; ``allow_outside_paths=True`` reads
them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from counting_server import CountingServer, counting_server

import shardfeed
from shardfeed import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.manifest import Manifest
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.verify import verify
from shardfeed.tools.verify.report import REFUSED_PATH

__all__ = ["counting_server"]  # the fixture, imported for pytest

SECRET = b"TOPSECRET token=hunter2 " * 8
SECRET_HEX = SECRET[:8].hex(" ")
BAD = 4  # the record holding the hostile path


def _layout(tmp_path: Path, hostile: bytes) -> Path:
    """home/secret.txt (the user's), home/data/photos (4 JPEGs), home/data/ds whose record 4
    names ``hostile``."""
    home = tmp_path / "home"
    photos = home / "data" / "photos"
    photos.mkdir(parents=True)
    (home / "secret.txt").write_bytes(SECRET)
    rng = np.random.default_rng(1)
    names = []
    for i in range(4):
        (photos / f"{i}.jpg").write_bytes(
            simplejpeg.encode_jpeg(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)))
        names.append(f"{i}.jpg".encode())
    names.insert(BAD, hostile)
    names.append(b"3.jpg")
    ds = home / "data" / "ds"
    ds.mkdir()
    with ShardWriter(ds / "part-0.tfrecord") as writer:
        for label, name in enumerate(names):
            writer.write_example({"image/path": name, "image/class/label": label})
    schema = Schema(
        features={"image/path": FeatureInfo("image/path", "bytes", 1),
                  "image/class/label": FeatureInfo("image/class/label", "int64", 1)},
        image=ImageInfo("image/path", "path"), label_key="image/class/label",
    )
    Manifest(shards=[writer.close()], schema=schema, mode="referenced",
             root=str(photos)).save(ds / "shardfeed.json")
    return ds


def _hostile(kind: str, tmp_path: Path) -> bytes:
    secret = tmp_path / "home" / "secret.txt"
    return {
        "dotdot": b"../../secret.txt",
        "absolute": os.fsencode(secret),
        "file-url": b"file://" + os.fsencode(secret),
        "link": b"holiday.jpg",
    }[kind]


def _epoch(ds: Dataset, **options: object) -> shardfeed.Loader:
    return shardfeed.Loader(ds, batch_size=3, shuffle=False, num_threads=2,
                            transform=shardfeed.presets.eval(size=8), **options)


def _no_secret(text: str) -> None:
    assert "TOPSECRET" not in text and "hunter2" not in text and SECRET_HEX not in text


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "file-url", "link"])
def test_a_record_naming_a_file_outside_the_root_is_refused(tmp_path: Path, kind: str) -> None:
    ds_folder = _layout(tmp_path, _hostile(kind, tmp_path))
    if kind == "link":
        os.symlink(tmp_path / "home" / "secret.txt",
                   tmp_path / "home" / "data" / "photos" / "holiday.jpg")
    with Dataset(ds_folder) as ds:
        assert ds.root == str(tmp_path / "home" / "data" / "photos")
        _shard, record, offset = ds.locate(BAD)
        seen: list[int] = []
        with pytest.raises(DecodeError) as caught:
            for batch in _epoch(ds):
                seen.extend(batch["image/class/label"].tolist())
        assert seen == [0, 1, 2]  # the batch before the bad record arrives
        message = str(caught.value)
        assert "part-0.tfrecord" in message and f"record {record} at byte {offset}" in message
        assert _hostile(kind, tmp_path).decode() in message
        assert "allow_outside_paths=True" in message
        _no_secret(message)

        skipping = _epoch(ds, on_error="skip", max_skipped=2)
        labels = sorted(x for b in skipping for x in b["image/class/label"].tolist())
        assert BAD not in labels and len(labels) == 6 and skipping.stats().skipped_total == 1

    # the user trusts the dataset: the file is read, and its bytes still stay out of the
    # message when it does not decode
    with Dataset(ds_folder, allow_outside_paths=True) as ds:
        with pytest.raises(DecodeError, match=r"cannot decode image") as caught:
            list(_epoch(ds))
        _no_secret(str(caught.value))


def test_a_record_naming_an_http_url_sends_no_request(
    tmp_path: Path, counting_server: CountingServer
) -> None:
    url = counting_server.url("x.jpg")
    with Dataset(_layout(tmp_path, url.encode())) as ds:
        with pytest.raises(DecodeError, match="http://") as caught:
            list(_epoch(ds))
        assert f"record {BAD}" in str(caught.value)
    assert counting_server.requests == []


@pytest.mark.parametrize("hostile", [b"0.jpg\x00../../secret.txt", b"caf\xe9.jpg"],
                         ids=["nul", "latin-1"])
def test_a_path_with_a_nul_byte_or_not_utf8_is_a_skippable_decode_error(
    tmp_path: Path, hostile: bytes
) -> None:
    with Dataset(_layout(tmp_path, hostile)) as ds:
        with pytest.raises(DecodeError, match=r"NUL byte|not UTF-8") as caught:
            list(_epoch(ds))
        assert f"record {BAD}" in str(caught.value)
        skipping = _epoch(ds, on_error="skip", max_skipped=2)
        assert sum(len(b["image/class/label"]) for b in skipping) == 6
        assert skipping.stats().skipped_total == 1


def test_verify_reports_the_refused_path_without_the_file_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds_folder = _layout(tmp_path, b"../../secret.txt")
    report = verify(ds_folder, decode=True)
    assert [(p.kind, p.record) for p in report.problems] == [(REFUSED_PATH, BAD)]
    assert "../../secret.txt" in report.problems[0].detail
    _no_secret(str(report.problems[0]))

    from shardfeed.cli.main import main

    assert main(["verify", str(ds_folder), "--decode", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "../../secret.txt" in out and "--allow-outside-paths" in out
    _no_secret(out)
    assert main(["verify", str(ds_folder), "--decode", "--no-progress",
                 "--allow-outside-paths"]) == 1  # read now: not an image
    out = capsys.readouterr().out
    assert "undecodable image" in out
    _no_secret(out)


def test_the_packed_layout_still_reads_and_moves(tmp_path: Path) -> None:
    """``data/photos`` + ``data/ds`` (root ``../photos``) keeps working, also once moved."""
    ds_folder = _layout(tmp_path, b"2.jpg")
    moved = tmp_path / "elsewhere"
    os.rename(tmp_path / "home", moved)
    with Dataset(moved / "data" / "ds") as ds:
        assert sum(len(b["image"]) for b in _epoch(ds)) == 6
    assert verify(moved / "data" / "ds", decode=True).ok
    assert not ds_folder.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX links")
def test_a_link_inside_the_root_is_followed(tmp_path: Path) -> None:
    ds_folder = _layout(tmp_path, b"alias.jpg")
    photos = tmp_path / "home" / "data" / "photos"
    os.symlink(photos / "1.jpg", photos / "alias.jpg")
    with Dataset(ds_folder) as ds:
        assert sum(len(b["image"]) for b in _epoch(ds)) == 6
