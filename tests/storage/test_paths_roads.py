"""A sibling whose name starts like the root is outside it, on every road where data names a
path: ``imgs-private`` is not inside ``imgs``, ``ds-private`` not inside ``ds``.

The user's machine::

    home/
      imgs/            the root the user names (0.png, 1.png)
      imgs-private/    the user's own: secret.png (a valid image, so a wrong "inside" packs it)
      ds/              a downloaded dataset
      ds-private/      the user's own TFRecord file

Each road is walked as a user walks it: images referenced under ``root=`` read by a Loader,
Parquet path columns and rows packed with ``--root``/``root=``, a Hugging Face image column
with paths, and a manifest naming shards. The paths take every shape that reaches the sibling:
``../imgs-private/x``, absolute, ``sub/../../imgs-private/x``, a link inside the root, and a
root that is itself a link. (Tar members never name local files: links in a tar are refused by
type, tests/tools/test_pack_tars.py; a Hugging Face folder's data files are in
tests/tools/test_pack_hf_saved.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

import shardfeed
from shardfeed import Dataset, PackError, RowFields, pack
from shardfeed.errors import DecodeError, UnsafePathError
from shardfeed.format.manifest import Manifest
from shardfeed.format.schema import FeatureInfo, ImageInfo, Schema
from shardfeed.format.writer import ShardWriter
from shardfeed.storage.paths import contained

SIBLING_SHAPES = ("dotdot", "absolute", "dotdot-inside", "link")


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    return bytes(cv2.imencode(".png", pixels)[1])


SECRET = png(99)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    imgs = tmp_path / "imgs"
    (imgs / "sub").mkdir(parents=True)
    for i in range(2):
        (imgs / f"{i}.png").write_bytes(png(i))
    (tmp_path / "imgs-private").mkdir()
    (tmp_path / "imgs-private" / "secret.png").write_bytes(SECRET)
    return tmp_path


def _named(home: Path, shape: str, *, root: str = "imgs") -> str:
    """The path a hostile record gives for ``home/<root>-private/secret.png``, relative to
    ``home/<root>`` (``link`` plants ``escape.png`` in the root, leading there)."""
    secret = home / f"{root}-private" / "secret.png"
    if shape == "link":
        (home / root / "escape.png").symlink_to(secret)
        return "escape.png"
    return {"dotdot": f"../{root}-private/secret.png", "absolute": str(secret),
            "dotdot-inside": f"sub/../../{root}-private/secret.png"}[shape]


def _reason(shape: str) -> str:
    return "through a symbolic link" if shape == "link" else "leads out of"


@pytest.mark.parametrize("shape", SIBLING_SHAPES)
def test_the_check_itself_refuses_a_sibling(home: Path, shape: str) -> None:
    named = _named(home, shape)
    with pytest.raises(UnsafePathError, match=_reason(shape)):
        contained(str(home / "imgs"), named, where="record 1", what="image")
    assert contained(str(home / "imgs"), "sub/../0.png", where="record 1",
                     what="image") == str(home / "imgs" / "0.png")


@pytest.mark.parametrize("named", ["../ds-private/x", "s3://b/ds-private/x", "s3://b/ds-/x",
                                   "%2e%2e/ds-private/x"])
def test_a_sibling_prefix_on_object_storage_is_refused(named: str) -> None:
    with pytest.raises(UnsafePathError, match="leads out of 's3://b/ds'"):
        contained("s3://b/ds", named, where="manifest", what="shard")


def _referenced(home: Path, names: list[str]) -> Path:
    """home/ds: a referenced dataset whose records name ``names`` (labels 0, 1, ...)."""
    ds = home / "ds"
    ds.mkdir()
    with ShardWriter(ds / "part-0.tfrecord") as writer:
        for label, name in enumerate(names):
            writer.write_example({"image/path": name.encode(), "image/class/label": label})
    schema = Schema(
        features={"image/path": FeatureInfo("image/path", "bytes", 1),
                  "image/class/label": FeatureInfo("image/class/label", "int64", 1)},
        image=ImageInfo("image/path", "path"), label_key="image/class/label",
    )
    Manifest(shards=[writer.close()], schema=schema, mode="referenced",
             root="../imgs").save(ds / "shardfeed.json")
    return ds


def _read_all(ds: Dataset) -> list[int]:
    loader = shardfeed.Loader(ds, batch_size=2, shuffle=False, num_threads=2,
                              transform=shardfeed.presets.eval(size=4))
    return [x for batch in loader for x in batch["image/class/label"].tolist()]


@pytest.mark.parametrize("shape", SIBLING_SHAPES)
def test_a_referenced_record_naming_a_sibling_of_root_is_refused(home: Path, shape: str) -> None:
    """``Dataset(ds, root=imgs)``, then a Loader: the record naming the sibling stops it."""
    named = _named(home, shape)
    ds = Dataset(_referenced(home, ["0.png", named]), root=str(home / "imgs"))
    with ds, pytest.raises(DecodeError, match=_reason(shape)) as caught:
        _read_all(ds)
    assert "record 1" in str(caught.value) and named in str(caught.value)


def test_a_root_that_is_a_link_confines_to_the_folder_it_leads_to(home: Path) -> None:
    """root=home/imgs, a link to store/imgs: a link inside it to store/imgs-private (the real
    folder's sibling) is refused, the root's own files are read."""
    store = home / "store"
    store.mkdir()
    os.rename(home / "imgs", store / "imgs")
    os.rename(home / "imgs-private", store / "imgs-private")
    (home / "imgs").symlink_to(store / "imgs")
    (store / "imgs" / "escape.png").symlink_to(store / "imgs-private" / "secret.png")
    with Dataset(_referenced(home, ["0.png", "1.png"]), root=str(home / "imgs")) as ds:
        assert _read_all(ds) == [0, 1]
    for named in ("escape.png", str(store / "imgs-private" / "secret.png")):
        rows = [{"image": "0.png", "label": 0}, {"image": named, "label": 1}]
        with pytest.raises(UnsafePathError, match="row 1, column 'image'"):
            pack(rows, home / "out", root=home / "imgs")


@pytest.mark.parametrize("shape", SIBLING_SHAPES)
def test_a_parquet_path_column_naming_a_sibling_of_root_is_refused(
    home: Path, shape: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """``shardfeed pack list.parquet out --image-column path --root imgs``."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from shardfeed.cli.main import main

    named = _named(home, shape)
    pq.write_table(pa.table({"path": ["0.png", named], "y": [0, 1]}), home / "list.parquet")
    assert main(["pack", str(home / "list.parquet"), str(home / "out"), "--image-column",
                 "path", "--root", str(home / "imgs"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"'{home / 'list.parquet'}', row 1, column 'path'" in err and _reason(shape) in err
    assert not (home / "out").exists() or os.listdir(home / "out") == []


@pytest.mark.parametrize("shape", SIBLING_SHAPES)
def test_rows_and_hugging_face_paths_naming_a_sibling_of_root_are_refused(
    home: Path, shape: str,
) -> None:
    named = _named(home, shape)
    with pytest.raises(PackError, match=f"row 1, column 'image'.*{_reason(shape)}"):
        pack([{"image": "0.png", "label": 0}, {"image": named, "label": 1}], home / "out",
             fields=RowFields(root=str(home / "imgs")))
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": None, "path": str(home / "imgs" / "0.png")},
                   {"bytes": None, "path": named}], "label": [0, 1]}, features=features)
    with pytest.raises(UnsafePathError, match=f"row 1, column 'image'.*{_reason(shape)}"):
        pack(hf, home / "out-hf", root=home / "imgs")


@pytest.mark.parametrize("shape", ["dotdot", "absolute", "link"])
def test_a_manifest_naming_a_shard_in_a_sibling_folder_is_refused(
    tmp_path: Path, shape: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """A downloaded ds/ whose manifest names the user's ds-private/part.tfrecord: Dataset and
    ``shardfeed inspect`` refuse it and name the opt-in."""
    from shardfeed.cli.main import main

    (tmp_path / "ds").mkdir()
    (tmp_path / "ds-private").mkdir()
    with ShardWriter(tmp_path / "ds-private" / "part.tfrecord") as writer:
        for label in range(4):
            writer.write_example({"image/class/label": label})
    info = writer.close()
    named = {"dotdot": "../ds-private/part.tfrecord",
             "absolute": str(tmp_path / "ds-private" / "part.tfrecord"),
             "link": "part.tfrecord"}[shape]
    if shape == "link":
        (tmp_path / "ds" / "part.tfrecord").symlink_to(tmp_path / "ds-private" / "part.tfrecord")
    shard = type(info)(path=named, records=info.records, bytes=info.bytes, crc32c=info.crc32c)
    Manifest(shards=[shard], mode="tfrecord").save(tmp_path / "ds" / "shardfeed.json")
    with pytest.raises(UnsafePathError, match=_reason(shape)):
        Dataset(str(tmp_path / "ds"))
    assert main(["inspect", str(tmp_path / "ds")]) == 1
    err = capsys.readouterr().err
    assert named in err and "--allow-outside-paths" in err
    with Dataset(str(tmp_path / "ds"), allow_outside_paths=True) as ds:  # the user's opt-in
        assert len(ds) == 4
