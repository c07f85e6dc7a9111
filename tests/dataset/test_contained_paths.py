"""A downloaded dataset's manifest names only files inside it, unless the user opts in.

Each test builds the hostile dataset a user could download: a manifest whose shard paths climb
out with ``../``, are absolute, are ``http://`` URLs, or are links leading out; an image root
of ``/etc`` or ``../../..``; index and sidecar files that are links out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from counting_server import CountingServer, counting_server

from shardfeed import Dataset
from shardfeed.errors import FormatError, UnsafePathError
from shardfeed.format.manifest import Manifest, ShardInfo, save_sidecars
from shardfeed.format.writer import ShardWriter
from shardfeed.tools.inspect import inspect
from shardfeed.tools.verify import verify

__all__ = ["counting_server"]  # the fixture, imported for pytest


def _shard(path: Path, labels: range) -> ShardInfo:
    path.parent.mkdir(parents=True, exist_ok=True)
    with ShardWriter(path) as writer:
        for label in labels:
            writer.write_example({"image/class/label": label, "note": b"x" * 10})
    return writer.close()


def _unindexed_copy(info: ShardInfo, src: Path, dst: Path) -> ShardInfo:
    """The shard's bytes at ``dst`` without its index files (as a hostile download holds)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(src.read_bytes())
    return info


def _dataset(folder: Path, paths: list[str], infos: list[ShardInfo], **fields: object) -> Path:
    shards = [ShardInfo(path=p, records=i.records, bytes=i.bytes, crc32c=i.crc32c)
              for p, i in zip(paths, infos)]
    folder.mkdir(parents=True, exist_ok=True)
    doc = Manifest(shards=shards, mode="tfrecord").to_json()
    doc.update(fields)
    (folder / "shardfeed.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def download(tmp_path: Path) -> Path:
    """downloads/ds: a dataset with one shard of its own (3 records)."""
    _shard(tmp_path / "downloads" / "ds" / "own.tfrecord", range(3))
    return tmp_path / "downloads" / "ds"


def _foreign(tmp_path: Path, where: Path) -> ShardInfo:
    """A TFRecord file of the user's outside the dataset, without index files."""
    info = _shard(tmp_path / "made" / "f.tfrecord", range(100, 105))
    return _unindexed_copy(info, tmp_path / "made" / "f.tfrecord", where)


def _own(download: Path) -> ShardInfo:
    data = (download / "own.tfrecord").read_bytes()
    return ShardInfo(path="own.tfrecord", records=3, bytes=len(data))


@pytest.mark.parametrize("how", ["relative", "absolute", "file-url"])
def test_a_shard_outside_the_dataset_is_refused_and_nothing_is_written_beside_it(
    download: Path, tmp_path: Path, how: str
) -> None:
    secret = tmp_path / "downloads" / "secret.tfrecord"
    info = _foreign(tmp_path, secret)
    named = {"relative": "../secret.tfrecord", "absolute": str(secret),
             "file-url": f"file://{secret}"}[how]
    _dataset(download, ["own.tfrecord", named], [_own(download), info])
    with pytest.raises(UnsafePathError) as caught:
        Dataset(download)
    message = str(caught.value)
    assert named in message and "shardfeed.json" in message
    assert "allow_outside_paths=True" in message
    assert caught.value.named == named
    assert isinstance(caught.value, FormatError)
    assert sorted(p.name for p in secret.parent.iterdir()) == ["ds", "secret.tfrecord"]

    with Dataset(download, allow_outside_paths=True) as ds:  # the user trusts it
        labels = [int(r["image/class/label"][0]) for r in ds]
    assert labels == [0, 1, 2, 100, 101, 102, 103, 104]


def test_a_local_manifest_naming_an_http_shard_sends_no_request(
    download: Path, counting_server: CountingServer
) -> None:
    url = counting_server.url("x.tfrecord")
    _dataset(download, ["own.tfrecord", url],
             [_own(download), ShardInfo(path="x", records=2, bytes=40)])
    with pytest.raises(UnsafePathError, match="http://") as caught:
        Dataset(download)
    assert url in str(caught.value)
    with pytest.raises(UnsafePathError):
        verify(download)
    with pytest.raises(UnsafePathError):
        inspect(download)
    assert counting_server.requests == []


def test_a_shard_that_is_a_link_out_of_the_dataset_is_refused(
    download: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "home" / "private.tfrecord"
    info = _foreign(tmp_path, secret)
    os.symlink(secret, download / "linked.tfrecord")
    _dataset(download, ["own.tfrecord", "linked.tfrecord"], [_own(download), info])
    with pytest.raises(UnsafePathError, match="symbolic link") as caught:
        Dataset(download)
    assert "linked.tfrecord" in str(caught.value)
    assert not (tmp_path / "home" / "private.tfrecord.idx").exists()
    with Dataset(download, allow_outside_paths=True) as ds:
        assert len(ds) == 8


def test_a_link_inside_the_dataset_is_followed(download: Path) -> None:
    (download / "sub").mkdir()
    os.symlink(download / "own.tfrecord", download / "sub" / "alias.tfrecord")
    info = _own(download)
    _dataset(download, ["sub/alias.tfrecord"], [info])
    with Dataset(download) as ds:
        assert len(ds) == 3


def test_an_index_file_linked_out_of_the_dataset_is_refused(
    download: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "home" / "notes.txt"
    outside.parent.mkdir(parents=True)
    outside.write_text("private text\n")
    (download / "own.tfrecord.idx.npy").unlink()
    (download / "own.tfrecord.idx").unlink()
    os.symlink(outside, download / "own.tfrecord.idx")
    _dataset(download, ["own.tfrecord"], [_own(download)])
    with pytest.raises(UnsafePathError, match="index file") as caught:
        Dataset(download)
    assert "private text" not in str(caught.value)


def test_a_sidecar_linked_out_of_the_dataset_is_refused(download: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "home"
    save_sidecars(elsewhere, group_ids=np.arange(3))
    os.symlink(elsewhere / "groups.npy", download / "groups.npy")
    _dataset(download, ["own.tfrecord"], [_own(download)], group_key="note")
    with pytest.raises(UnsafePathError, match="groups.npy"):
        Dataset(download)
    with Dataset(download, allow_outside_paths=True) as ds:
        assert ds.group_ids is not None and ds.group_ids.tolist() == [0, 1, 2]


@pytest.mark.parametrize("root", ["/etc", "../../..", "../../photos"])
def test_an_image_root_far_from_the_dataset_is_refused(download: Path, root: str) -> None:
    _dataset(download, ["own.tfrecord"], [_own(download)], mode="referenced", root=root)
    with pytest.raises(UnsafePathError, match="image root") as caught:
        Dataset(download)
    message = str(caught.value)
    assert "root=" in message and "allow_outside_paths=True" in message
    with Dataset(download, allow_outside_paths=True) as ds:
        assert os.path.isabs(ds.root or "")
    with Dataset(download, root=download) as ds:  # a root the user names is trusted
        assert ds.root == str(download)


@pytest.mark.parametrize("root", ["..", "../photos", "images"])
def test_an_image_root_beside_the_dataset_is_kept(download: Path, root: str) -> None:
    _dataset(download, ["own.tfrecord"], [_own(download)], mode="referenced", root=root)
    with Dataset(download) as ds:
        assert ds.root == os.path.normpath(download / root)


def test_a_folder_whose_name_looks_like_a_glob_is_opened_as_that_folder(tmp_path: Path) -> None:
    wanted = tmp_path / "exp[1]" / "ds"
    _shard(wanted / "a.tfrecord", range(4))
    _shard(tmp_path / "exp1" / "ds" / "a.tfrecord", range(9))  # what the glob would match
    with Dataset(str(wanted)) as ds:
        assert len(ds) == 4
    with Dataset([str(wanted / "a.tfrecord")]) as ds:
        assert len(ds) == 4
    with pytest.raises(FormatError, match=r"no files match the pattern .*no file or folder"):
        Dataset(str(tmp_path / "exp[2]" / "*.tfrecord"))
    with Dataset(str(tmp_path / "exp[1]" / "ds" / "*.tfrecord")) as ds:  # still a glob
        assert len(ds) == 9
