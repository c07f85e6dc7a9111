"""``pack`` and ``index`` with object storage (moto S3 on 127.0.0.1), from the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg

from shardfeed import Dataset
from shardfeed.cli.main import main


def _photos(folder: Path, per_class: int = 5) -> Path:
    """photos/<class>/img.jpg: real JPEGs in two class folders."""
    rng = np.random.default_rng(7)
    for name in ("cat", "dog"):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (16, 20, 3), dtype=np.uint8)
            (folder / name / f"{i}.jpg").write_bytes(simplejpeg.encode_jpeg(pixels))
    return folder


def _records(ds: Dataset) -> list[tuple[bytes, int]]:
    return [(r["image/encoded"], int(r["image/class/label"][0])) for r in ds]


def test_pack_to_s3_uploads_shards_then_manifest(s3_server: Any, tmp_path: Path) -> None:
    photos = _photos(tmp_path / "photos")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    args = ["--records-per-shard", "3", "--no-progress"]
    assert main(["pack", str(photos), url, *args]) == 0
    assert main(["pack", str(photos), str(tmp_path / "local"), *args]) == 0
    puts = [r.path.rsplit("/", 1)[-1] for r in s3_server.requests("PUT")]
    assert puts[-1] == "shardfeed.json"  # the manifest last
    shards = [p for p in puts if p.endswith(".tfrecord")]
    assert len(shards) == 4  # 10 images, 3 a shard
    for name in shards:  # each shard before its indexes
        assert puts.index(name) < puts.index(name + ".idx") < puts.index(name + ".idx.npy")
    with Dataset(url) as remote, Dataset(str(tmp_path / "local")) as local:
        assert len(remote) == 10
        assert _records(remote) == _records(local)
    fs = s3_server.filesystem()
    for name in shards:  # byte-identical to the local pack
        assert fs.cat_file(f"{bucket}/ds/{name}") == (tmp_path / "local" / name).read_bytes()
    # a second pack into the same prefix is refused; --overwrite replaces it
    assert main(["pack", str(photos), url, *args]) == 1
    assert main(["pack", str(photos), url, *args, "--records-per-shard", "5",
                 "--overwrite"]) == 0
    with Dataset(url) as again:
        assert again.num_shards == 2 and len(again) == 10


def test_pack_to_s3_refuses_resume(s3_server: Any, tmp_path: Path) -> None:
    from shardfeed.tools.pack import pack

    photos = _photos(tmp_path / "photos", per_class=1)
    with pytest.raises(ValueError, match="local outputs only"):
        pack(str(photos), f"s3://{s3_server.new_bucket()}/ds", resume=True)


def test_index_tfrecords_in_a_bucket(
    s3_server: Any, tf_fixtures: Path, tmp_path: Path
) -> None:
    """TFRecord files written by TensorFlow, in a bucket, indexed where they are."""
    folder = tmp_path / "tf"
    folder.mkdir()
    for name in ("mixed.tfrecord", "second.tfrecord"):
        shutil.copy(tf_fixtures / name, folder / name)
    url = s3_server.upload_folder(folder)
    s3_server.clear_log()
    assert main(["index", url + "/*.tfrecord", "--no-progress"]) == 0
    puts = [r.path.rsplit("/", 1)[-1] for r in s3_server.requests("PUT")]
    assert puts[-1] == "shardfeed.json"
    assert {"mixed.tfrecord.idx", "mixed.tfrecord.idx.npy", "second.tfrecord.idx"} <= set(puts)
    ranged = [r for r in s3_server.requests("GET") if r.path.endswith(".tfrecord")]
    assert ranged and all(r.range for r in ranged)  # read by byte range
    dali = (tf_fixtures / "mixed.idx").read_bytes()  # the index DALI's tfrecord2idx wrote
    assert s3_server.filesystem().cat_file(
        url.removeprefix("s3://") + "/mixed.tfrecord.idx") == dali
    with Dataset(url) as remote, Dataset([str(folder / "mixed.tfrecord"),
                                          str(folder / "second.tfrecord")]) as local:
        assert remote.manifest.shards[0].path == "mixed.tfrecord"
        assert len(remote) == len(local) == 30
        assert remote.read_payloads(range(30)) == local.read_payloads(range(30))



def test_pack_to_s3_overwrite_keeps_objects_pack_did_not_write(
    s3_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    photos = _photos(tmp_path / "photos")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"
    fs = s3_server.filesystem()
    assert main(["pack", str(photos), url, "--records-per-shard", "3", "--no-progress"]) == 0
    first = set(fs.ls(f"{bucket}/ds", detail=False))
    mine = {"important.tfrecord": b"the user's own records", "notes.txt": b"mine"}
    for name, data in mine.items():
        fs.pipe_file(f"{bucket}/ds/{name}", data)
    assert main(["pack", str(photos), url, "--records-per-shard", "5", "--overwrite",
                 "--no-progress"]) == 0
    for name, data in mine.items():
        assert fs.cat_file(f"{bucket}/ds/{name}") == data
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(said) == 1 and "keeps 2 objects pack did not write" in said[0]
    now = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/ds", detail=False, refresh=True)}
    assert not {p.rsplit("/", 1)[-1] for p in first if "-of-00004" in p} & now
    assert ".shardfeed-pack.json" not in now
    with Dataset(url) as ds:
        assert ds.num_shards == 2 and len(ds) == 10
    # an object of a name the new pack would write, which no pack wrote: refused, kept
    fs.pipe_file(f"{bucket}/ds/shard-00000-of-00010.tfrecord", b"not pack's")
    assert main(["pack", str(photos), url, "--records-per-shard", "1", "--overwrite",
                 "--no-progress"]) == 1
    assert fs.cat_file(f"{bucket}/ds/shard-00000-of-00010.tfrecord") == b"not pack's"
    with Dataset(url) as ds:  # the earlier dataset is still whole
        assert ds.num_shards == 2 and len(ds) == 10


def test_interrupted_pack_to_s3_is_cleared_by_overwrite(s3_server: Any, tmp_path: Path) -> None:
    from shardfeed.tools.pack import pack

    photos = _photos(tmp_path / "photos")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds"

    class Stop(Exception):
        pass

    def stop(path: str) -> None:
        raise Stop(path)

    with pytest.raises(Stop):  # killed after its first shard went up
        pack(str(photos), url, records_per_shard=3, on_shard=stop)
    fs = s3_server.filesystem()
    fs.pipe_file(f"{bucket}/ds/notes.txt", b"mine")
    assert main(["pack", str(photos), url, "--records-per-shard", "5", "--overwrite",
                 "--no-progress"]) == 0
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/ds", detail=False, refresh=True)}
    assert not [n for n in names if "-of-00004" in n]  # the interrupted pack's shard is gone
    assert "notes.txt" in names and ".shardfeed-pack.json" not in names
    with Dataset(url) as ds:
        assert len(ds) == 10


def test_append_to_s3_commits_a_version_and_two_at_once_keep_one(
        s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfeed.errors import PackError
    from shardfeed.tools.pack import append as packappend
    from shardfeed.tools.pack import pack

    first = _photos(tmp_path / "first", per_class=2)
    more = tmp_path / "more"
    more.mkdir()
    shutil.move(str(_photos(tmp_path / "m", per_class=1) / "cat"), str(more / "fox"))  # new
    url = f"s3://{s3_server.new_bucket()}/ds"
    assert main(["pack", str(first), url, "--no-progress"]) == 0
    assert main(["pack", str(more), url, "--append", "--no-progress"]) == 0
    with Dataset(url) as grown, Dataset(url, version=1) as old:
        assert (grown.version, len(grown), len(old)) == (2, 5, 4)
        assert grown.manifest.extra["vocabularies"]["image/class/label"] == ["cat", "dog", "fox"]
        folder = grown.manifest.shards[-1].path.split("/")[0]
        assert folder.startswith("v2-")  # a folder of its own: no other append writes there
    puts = [r.path.rsplit("/", 1)[-1] for r in s3_server.requests("PUT")]
    assert puts[-1] == "shardfeed.json" and "shardfeed.v2.json" in puts
    # another append commits version 3 while this one packs: the conditional PUT refuses
    real = packappend._merged

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        s3_server.filesystem().pipe_file(url.removeprefix("s3://") + "/shardfeed.v3.json",
                                          b"{}")
        return made

    monkeypatch.setattr(packappend, "_merged", meanwhile)
    with pytest.raises(PackError, match="another append committed version 3 .* your input "
                                        "was not added"):
        pack(str(more), url, append=True)
    monkeypatch.undo()
    with Dataset(url) as still:
        assert (still.version, len(still)) == (2, 5)
    from shardfeed.storage import files

    files.remove(url + "/shardfeed.v3.json")
    # a stopped append run again with --resume: a new folder, the commit
    assert main(["pack", str(more), url, "--append", "--resume", "--no-progress"]) == 0
    with Dataset(url) as third:
        assert (third.version, len(third)) == (3, 6)
    # --overwrite removes every object the appends wrote (their folders too)
    assert main(["pack", str(first), url, "--overwrite", "--no-progress"]) == 0
    left = s3_server.filesystem().find(url.removeprefix("s3://"))
    assert not [k for k in left if "/v2-" in k or "/v3-" in k or ".v" in k.rsplit("/", 1)[-1]]
    with Dataset(url) as again:
        assert (again.version, len(again)) == (1, 4)


def test_compact_on_s3_keeps_the_records_and_the_fingerprint(s3_server: Any,
                                                             tmp_path: Path) -> None:
    first = _photos(tmp_path / "first", per_class=2)
    url = f"s3://{s3_server.new_bucket()}/ds"
    assert main(["pack", str(first), url, "--records-per-shard", "2", "--no-progress"]) == 0
    for k in range(3):
        more = tmp_path / f"more{k}"
        more.mkdir()
        shutil.move(str(_photos(tmp_path / f"m{k}", per_class=1) / "cat"), str(more / "cat"))
        assert main(["pack", str(more), url, "--append", "--no-progress"]) == 0
    with Dataset(url) as before:
        fingerprint, payloads = before.fingerprint, before.read_payloads(range(len(before)))
        shards, version = before.num_shards, before.version
    assert main(["compact", url, "--records-per-shard", "8"]) == 0
    with Dataset(url) as after:
        assert after.version == version + 1 and after.num_shards < shards
        assert after.fingerprint == fingerprint
        assert after.read_payloads(range(len(after))) == payloads
