"""A referenced dataset keeps working when it moves with its images, and re-points with root=."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

import shardfeed
from shardfeed import Dataset
from shardfeed.errors import DecodeError
from shardfeed.tools.pack import pack
from shardfeed.tools.verify import verify
from shardfeed.transforms.decode.ops import DecodeImage


def _photos(folder: Path) -> dict[str, np.ndarray]:
    """photos/<class>/<i>.jpg; returns each stored name's decoded pixels."""
    rng = np.random.default_rng(5)
    pixels: dict[str, np.ndarray] = {}
    for name in ("cat", "dog"):
        (folder / name).mkdir(parents=True)
        for i in range(3):
            data = simplejpeg.encode_jpeg(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8))
            (folder / name / f"{i}.jpg").write_bytes(data)
            pixels[f"{name}/{i}.jpg"] = simplejpeg.decode_jpeg(data)
    return pixels


def _decoded(ds: Dataset) -> dict[str, np.ndarray]:
    """Every record's image, decoded by the library through the dataset's root."""
    decode = DecodeImage().bind(ds.schema, root=ds.root)
    return {r["image/path"].decode(): decode(dict(r), None)["image"] for r in ds}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """The same images (up to JPEG decoders' rounding: a different file is ~85 apart)."""
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.abs(a[k].astype(int) - b[k]).mean() < 4 for k in a)


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """data/photos (the images) and data/packed (a referenced dataset of them)."""
    data = tmp_path / "machine-a" / "data"
    pixels = _photos(data / "photos")
    pack(data / "photos", data / "packed", mode="referenced", records_per_shard=4)
    return data, pixels


def test_moving_the_folder_with_its_images_keeps_every_record(
    packed: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    data, pixels = packed
    stored = json.loads((data / "packed" / "shardfeed.json").read_text())["root"]
    assert stored == "../photos"  # relative to the manifest's folder
    moved = tmp_path / "machine-b" / "mnt"
    moved.mkdir(parents=True)
    shutil.move(str(data), str(moved))  # the whole folder, to a new parent
    assert not data.exists()
    with Dataset(moved / "data" / "packed") as ds:
        assert ds.root == str(moved / "data" / "photos")
        assert len(ds) == 6 and _same(_decoded(ds), pixels)
        loader = shardfeed.Loader(ds, batch_size=6, shuffle=False,
                                  transform=shardfeed.presets.eval(size=8))
        with loader:
            batch = next(iter(loader))
        assert batch["image"].shape[0] == 6
    assert verify(moved / "data" / "packed", decode=True).ok


def test_images_moved_separately_are_found_with_root(
    packed: tuple[Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    data, pixels = packed
    elsewhere = tmp_path / "images-now-here"
    shutil.move(str(data / "photos"), str(elsewhere))
    with Dataset(data / "packed") as ds, pytest.raises(DecodeError, match=r"Dataset\(root="):
        _decoded(ds)
    with Dataset(data / "packed", root=elsewhere) as ds:
        assert _same(_decoded(ds), pixels)
    assert verify(data / "packed", root=elsewhere, decode=True).ok


def test_manifest_with_an_absolute_root_still_opens(
    packed: tuple[Path, dict[str, np.ndarray]]
) -> None:
    """Manifests written before roots were stored relative hold the absolute path."""
    data, pixels = packed
    path = data / "packed" / "shardfeed.json"
    doc = json.loads(path.read_text())
    doc["root"] = str(data / "photos")
    path.write_text(json.dumps(doc))
    with Dataset(data / "packed") as ds:
        assert ds.root == str(data / "photos") and _same(_decoded(ds), pixels)


def test_root_far_from_the_dataset_stays_absolute(tmp_path: Path) -> None:
    """Images outside the folder holding the dataset (say a shared mount) keep their
    absolute path: moving only the dataset folder then keeps it readable."""
    pixels = _photos(tmp_path / "shared" / "photos")
    out = tmp_path / "runs" / "exp1" / "packed"
    pack(tmp_path / "shared" / "photos", out, mode="referenced", records_per_shard=4)
    assert json.loads((out / "shardfeed.json").read_text())["root"] == str(
        tmp_path / "shared" / "photos")
    shutil.move(str(out), str(tmp_path / "packed-copy"))
    with Dataset(tmp_path / "packed-copy") as ds:
        assert _same(_decoded(ds), pixels)
