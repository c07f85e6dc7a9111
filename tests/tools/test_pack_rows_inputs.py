"""Data as users hold it: folders of Parquet files, Hugging Face datasets with class names
and ``save_to_disk`` folders, from Python and the command; rows whose values a record cannot
hold (nulls, ragged lists) are refused naming the file, row and column."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from shardfeed import Dataset, PackError, RowFields, pack
from shardfeed.format.manifest import Manifest
from shardfeed.tools.pack.items import classes_from_path

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    return bytes(cv2.imencode(".png", pixels)[1])


def read_back(folder: Path) -> list[dict[str, Any]]:
    with Dataset(str(folder)) as ds:
        return ds.read_many(range(len(ds)))


def vocabularies(folder: Path) -> dict[str, list[str]]:
    return dict(Manifest.load(str(folder / "shardfeed.json")).extra.get("vocabularies", {}))


def test_a_folder_of_parquet_files_as_spark_writes_it(tmp_path: Path) -> None:
    from shardfeed.cli.main import main

    export = tmp_path / "export"
    for day, first in (("2024-05-01", 0), ("2024-05-02", 4)):
        folder = export / f"day={day}"
        folder.mkdir(parents=True)
        for part in range(2):
            ids = range(first + 2 * part, first + 2 * part + 2)
            pq.write_table(pa.table({"image": [png(i) for i in ids], "y": list(ids)}),
                           folder / f"part-{part:05d}.parquet")
    (export / "_SUCCESS").write_bytes(b"")
    (export / "day=2024-05-01" / ".part-00000.parquet.crc").write_bytes(b"crc")

    pack(export, tmp_path / "py")
    assert main(["pack", str(export), str(tmp_path / "cli"), "--no-progress"]) == 0
    for out in ("py", "cli"):
        records = read_back(tmp_path / out)
        assert [int(r["y"][0]) for r in records] == list(range(8))  # path order
        assert [r["day"] for r in records] == [b"2024-05-01"] * 4 + [b"2024-05-02"] * 4
        assert [r["image/encoded"] for r in records] == [png(i) for i in range(8)]


def test_hugging_face_class_names_become_the_manifests(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from shardfeed.cli.main import main

    names = ["cat", "dog", "fox"]
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=names),
                                  "source": datasets.ClassLabel(names=["web", "lab"])})
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": png(i), "path": None} for i in range(6)],
         "label": [i % 3 for i in range(6)], "source": [i % 2 for i in range(6)]},
        features=features)

    pack(hf, tmp_path / "object")
    assert vocabularies(tmp_path / "object") == {"label": names, "source": ["web", "lab"]}
    assert classes_from_path(tmp_path / "object") == tuple(names)  # --classes-from takes it

    hf.save_to_disk(str(tmp_path / "saved"))
    assert main(["pack", str(tmp_path / "saved"), str(tmp_path / "cli"), "--label-columns",
                 "label", "--no-progress"]) == 0
    records = read_back(tmp_path / "cli")
    assert [int(r["label"][0]) for r in records] == [i % 3 for i in range(6)]
    assert [r["image/encoded"] for r in records] == [png(i) for i in range(6)]
    assert vocabularies(tmp_path / "cli") == {"label": names}  # only the packed labels'

    hf.to_parquet(str(tmp_path / "hub.parquet"))  # as the Hub stores datasets
    pack(tmp_path / "hub.parquet", tmp_path / "parquet")
    assert vocabularies(tmp_path / "parquet")["label"] == names


def test_a_saved_dataset_dict_is_refused_naming_its_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    split = datasets.Dataset.from_dict({"image": [png(0)], "label": [0]})
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(PackError, match=r"splits of a Hugging Face DatasetDict \(test, "
                                        r"train\); pack one split at a time: '.*dd/test'"):
        pack(tmp_path / "dd", tmp_path / "out")


def test_laion_style_rows_with_nulls_are_named_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from shardfeed.cli.main import main

    rows = [{"image": png(i), "caption": f"a photo {i}", "width": 5, "error_message": None,
             "exif": json.dumps({})} for i in range(3)]
    rows[2]["caption"] = None
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "laion.parquet")
    assert main(["pack", str(tmp_path / "laion.parquet"), str(tmp_path / "out"),
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"'{tmp_path / 'laion.parquet'}', row 0, column 'error_message'" in err
    assert "null" in err and "--label-columns" in err and "partition" not in err
    assert os.listdir(tmp_path / "out") == []

    with pytest.raises(PackError, match=r"^the rows, row 2, column 'caption': the value is "
                                        r"null"):
        pack(rows, tmp_path / "out", fields=RowFields(labels=["caption", "width"]))
    pack(rows, tmp_path / "out", fields=RowFields(labels=["width"]))  # the fix it names
    assert [int(r["width"][0]) for r in read_back(tmp_path / "out")] == [5, 5, 5]


def test_a_ragged_nested_list_column_is_named(tmp_path: Path) -> None:
    table = pa.table({"image": [png(0), png(1)], "boxes": [[[1, 2], [3, 4]], [[1, 2], [3]]]})
    pq.write_table(table, tmp_path / "boxes.parquet")
    with pytest.raises(PackError) as caught:
        pack(tmp_path / "boxes.parquet", tmp_path / "out")
    text = str(caught.value)
    assert f"'{tmp_path / 'boxes.parquet'}', row 1, column 'boxes'" in text
    assert "inner lists differ in length" in text and "pad" in text
    assert "partition" not in text


def test_a_damaged_parquet_file_is_named(tmp_path: Path) -> None:
    pq.write_table(pa.table({"image": [png(0)], "y": [0]}), tmp_path / "a.parquet")
    whole = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(PackError, match=r"cannot read the Parquet file '.*b.parquet'"):
        pack([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


def test_a_folder_of_images_with_a_parquet_file_beside_them_stays_a_folder_of_images(
    tmp_path: Path,
) -> None:
    """An imagefolder-style layout (class folders and a metadata file) is packed as before:
    its class folders are the labels; the Parquet file is not taken for the data."""
    for k, name in enumerate(("cat", "dog")):
        (tmp_path / "photos" / name).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "photos" / name / "a.png"), np.full((4, 4, 3), k, np.uint8))
    pq.write_table(pa.table({"file_name": ["cat/a.png"], "y": [0]}),
                   tmp_path / "photos" / "metadata.parquet")
    pack(tmp_path / "photos", tmp_path / "out")
    records = read_back(tmp_path / "out")
    assert [int(r["image/class/label"][0]) for r in records] == [0, 1]
    assert vocabularies(tmp_path / "out") == {"image/class/label": ["cat", "dog"]}
