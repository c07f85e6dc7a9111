"""Image paths inside packed data (Parquet columns, Hugging Face datasets, rows of a
generator) are read only under a root the user names, and stay inside it; no message quotes
a file's contents."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, PackError, RowFields, pack
from shardfeed.errors import UnsafePathError


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    return bytes(cv2.imencode(".png", pixels)[1])


def read_back(folder: Path) -> list[dict[str, Any]]:
    with Dataset(str(folder)) as ds:
        return ds.read_many(range(len(ds)))


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file on the packing machine that no data may make pack read."""
    path = tmp_path / "private" / "token.txt"
    path.parent.mkdir()
    path.write_text("TOPSECRET-TOKEN-42\n")
    return path


def test_a_parquet_path_column_is_refused_without_a_root(tmp_path: Path, secret: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    images = [{"bytes": png(0), "path": None}, {"bytes": None, "path": str(secret)}]
    pq.write_table(pa.table({"image": images, "label": [0, 1]}), tmp_path / "x.parquet")
    with pytest.raises(PackError) as caught:
        pack(tmp_path / "x.parquet", tmp_path / "out")
    text = str(caught.value)
    assert isinstance(caught.value, UnsafePathError)
    assert f"'{tmp_path / 'x.parquet'}', row 1, column 'image'" in text
    assert "root=" in text and "--root" in text
    assert "TOPSECRET" not in text and "partition" not in text
    assert os.listdir(tmp_path / "out") == []


def test_with_a_root_paths_stay_inside_it(tmp_path: Path, secret: Path) -> None:
    images = tmp_path / "images"
    (images / "cats").mkdir(parents=True)
    (images / "cats" / "a.png").write_bytes(png(1))
    (images / "escape").symlink_to(secret)
    inside = [{"image": "cats/a.png", "label": 0},
              {"image": str(images / "cats" / "a.png"), "label": 1}]  # absolute, inside
    pack(inside, tmp_path / "ok", root=images)
    assert [r["image/encoded"] for r in read_back(tmp_path / "ok")] == [png(1)] * 2

    for named, reason in (("../private/token.txt", "leads out of"),
                          (str(secret), "leads out of"),
                          ("escape", "through a symbolic link")):
        out = tmp_path / f"bad-{len(os.listdir(tmp_path))}"
        with pytest.raises(UnsafePathError) as caught:
            pack([{"image": png(2), "label": 0}, {"image": named, "label": 1}], out,
                 fields=RowFields(root=str(images)))
        text = str(caught.value)
        assert "the rows, row 1, column 'image'" in text and reason in text
        assert "TOPSECRET" not in text
        assert os.listdir(out) == []


def test_a_file_under_the_root_that_is_no_image_is_named_not_quoted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.png").write_text("TOPSECRET-TOKEN-42 and more")
    with pytest.raises(PackError) as caught:
        pack([{"image": "notes.png", "label": 0}], tmp_path / "out", root=root)
    text = str(caught.value)
    assert f"(the file '{root / 'notes.png'}')" in text and "no image format" in text
    assert "TOPSECRET" not in text


def test_the_command_reads_parquet_paths_under_root(
    tmp_path: Path, secret: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from shardfeed.cli.main import main

    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        (images / f"{i}.png").write_bytes(png(i))
    pq.write_table(pa.table({"path": [f"{i}.png" for i in range(3)], "y": [0, 1, 2]}),
                   tmp_path / "list.parquet")
    args = ["pack", str(tmp_path / "list.parquet"), "--image-column", "path", "--no-progress"]
    assert main([*args, str(tmp_path / "refused")]) == 1
    assert "--root" in capsys.readouterr().err
    assert main([*args, str(tmp_path / "out"), "--root", str(images)]) == 0
    records = read_back(tmp_path / "out")
    assert [r["image/encoded"] for r in records] == [png(i) for i in range(3)]
    assert [int(r["y"][0]) for r in records] == [0, 1, 2]

    pq.write_table(pa.table({"path": ["0.png", str(secret)], "y": [0, 1]}),
                   tmp_path / "hostile.parquet")
    assert main(["pack", str(tmp_path / "hostile.parquet"), str(tmp_path / "h"),
                 "--image-column", "path", "--root", str(images), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "row 1" in err and "leads out of" in err and "TOPSECRET" not in err


def test_a_hugging_face_image_path_needs_the_root(tmp_path: Path, secret: Path) -> None:
    datasets = pytest.importorskip("datasets")
    images = tmp_path / "images"
    images.mkdir()
    (images / "a.png").write_bytes(png(3))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": None, "path": str(images / "a.png")},
                   {"bytes": None, "path": str(secret)}], "label": [0, 1]}, features=features)
    with pytest.raises(UnsafePathError, match=r"Hugging Face dataset, row 0.*pass root="):
        pack(hf, tmp_path / "out")
    with pytest.raises(UnsafePathError, match=r"row 1, column 'image'.*leads out of"):
        pack(hf, tmp_path / "out", root=images)
    pack(hf.select([0]), tmp_path / "out", root=images)
    assert [r["image/encoded"] for r in read_back(tmp_path / "out")] == [png(3)]
