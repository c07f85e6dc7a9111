"""pack across splits and times: fixed class lists, and order keys kept exact in their unit."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import shardfeed
from shardfeed.errors import PackError
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns


def _labels_by_class(out: Path) -> dict[str, int]:
    ds = shardfeed.Dataset(str(out))
    try:
        return {ds[i]["image/filename"].decode().split("/")[0]:
                int(ds[i]["image/class/label"][0]) for i in range(len(ds))}
    finally:
        ds.close()


@pytest.fixture
def splits(tmp_path: Path, make_image) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """train/{cat,dog,fox} with 2 images each; val/ with cat and fox only, dog empty."""
    for split, classes in (("train", ("cat", "dog", "fox")), ("val", ("cat", "fox"))):
        for k, name in enumerate(classes):
            for i in range(2):
                make_image(tmp_path / split / name / f"{i}.jpg", 10 * k + i)
    (tmp_path / "val" / "dog").mkdir()
    return tmp_path / "train", tmp_path / "val"


def test_val_split_with_an_empty_class_keeps_the_training_labels(
    splits: tuple[Path, Path], tmp_path: Path
) -> None:
    train, val = splits
    pack(train, tmp_path / "train_out")
    assert _labels_by_class(tmp_path / "train_out") == {"cat": 0, "dog": 1, "fox": 2}
    with pytest.raises(PackError, match=r"class folder '.*dog' holds no images.*--classes"):
        pack(val, tmp_path / "val_out")  # used to renumber: fox = 1 in val
    assert not (tmp_path / "val_out").exists()
    pack(val, tmp_path / "val_out", classes_from=tmp_path / "train_out")
    assert _labels_by_class(tmp_path / "val_out") == {"cat": 0, "fox": 2}
    ds = shardfeed.Dataset(str(tmp_path / "val_out"))
    try:
        assert ds.manifest.extra["vocabularies"]["image/class/label"] == ["cat", "dog", "fox"]
    finally:
        ds.close()
    shutil.rmtree(val / "dog")  # a class folder that is missing altogether: the same
    pack(val, tmp_path / "val2", classes=["cat", "dog", "fox"])
    assert _labels_by_class(tmp_path / "val2") == {"cat": 0, "fox": 2}
    pack(val, tmp_path / "val3", classes_from=train)  # a folder of class sub-folders
    assert _labels_by_class(tmp_path / "val3") == {"cat": 0, "fox": 2}


def test_class_list_order_is_the_label_and_unknown_folders_are_refused(
    splits: tuple[Path, Path], tmp_path: Path
) -> None:
    train, _val = splits
    pack(train, tmp_path / "a", classes=["fox", "cat", "dog"])
    assert _labels_by_class(tmp_path / "a") == {"fox": 0, "cat": 1, "dog": 2}
    with pytest.raises(PackError, match=r"'fox' of .* is not in the class list \(cat, dog\)"):
        pack(train, tmp_path / "b", classes=["cat", "dog"])
    with pytest.raises(TypeError, match="list of class names"):
        pack(train, tmp_path / "c", classes="cat,dog,fox")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'dog' more than once|dog more than once"):
        pack(train, tmp_path / "d", classes=["cat", "dog", "dog", "fox"])


def _frames_csv(tmp_path: Path, make_image, column: str,  # type: ignore[no-untyped-def]
                values: list[str]) -> Path:
    lines = [f"path,day,{column}"]
    for i, value in enumerate(values):
        make_image(tmp_path / f"f{i}.jpg", 50 + i, size=(8, 8))
        lines.append(f"f{i}.jpg,1,{value}")
    path = tmp_path / "frames.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_iso_times_2_5_s_apart_stay_apart_and_give_windows(tmp_path: Path, make_image) -> None:  # type: ignore[no-untyped-def]
    stamps = [f"2024-05-01T12:00:{2.5 * i:04.1f}" for i in range(6)]
    path = _frames_csv(tmp_path, make_image, "t", stamps)
    result = pack(path, tmp_path / "out", csv=CsvColumns(group="day", order="t"))
    assert result.order_unit == "iso"
    ds = shardfeed.Dataset(str(tmp_path / "out"))
    try:
        stored = [int(ds[i]["t"][0]) for i in range(len(ds))]
        assert np.diff(stored).tolist() == [2_500_000_000] * 5  # int64 ns, exact
        assert ds.order_keys is not None
        assert np.diff(ds.order_keys).tolist() == [2.5] * 5
        windows = shardfeed.Windows(ds, length=2, stride_seconds=5.0)
        assert [windows.index.frames(w).tolist() for w in range(len(windows))] == [
            [0, 2], [1, 3], [2, 4], [3, 5]]
        assert ds.manifest.extra["order_key_unit"] == "ns"
    finally:
        ds.close()


def test_epoch_milliseconds_are_detected_and_spaced_8_s(tmp_path: Path, make_image) -> None:  # type: ignore[no-untyped-def]
    start = 1_714_564_800_000
    path = _frames_csv(tmp_path, make_image, "t_ms", [str(start + 8000 * i) for i in range(5)])
    result = pack(path, tmp_path / "out", csv=CsvColumns(group="day", order="t_ms"))
    assert result.order_unit == "ms"
    ds = shardfeed.Dataset(str(tmp_path / "out"))
    try:
        assert ds.order_keys is not None
        assert np.diff(ds.order_keys).tolist() == [8.0] * 4
        assert float(ds.order_keys[0]) == start / 1000
        assert len(shardfeed.Windows(ds, length=3, stride_seconds=8.0)) == 3
    finally:
        ds.close()


def test_ambiguous_time_columns_are_refused_until_the_unit_is_given(
    tmp_path: Path, make_image  # type: ignore[no-untyped-def]
) -> None:
    path = _frames_csv(tmp_path, make_image, "t", ["0", "8000", "16000"])
    columns = CsvColumns(group="day", order="t")
    with pytest.raises(PackError, match=r"column 't'.*not Unix times.*--time-unit"):
        pack(path, tmp_path / "a", csv=columns)
    pack(path, tmp_path / "a", csv=CsvColumns(group="day", order="t", time_unit="ms"))
    ds = shardfeed.Dataset(str(tmp_path / "a"))
    try:
        assert ds.order_keys is not None and ds.order_keys.tolist() == [0.0, 8.0, 16.0]
    finally:
        ds.close()
    mixed = _frames_csv(tmp_path, make_image, "t", ["2024-05-01T00:00:00", "1714521608"])
    with pytest.raises(PackError, match=r"mixes ISO timestamps \(line 2\) and numbers \(line 3\)"):
        pack(mixed, tmp_path / "b", csv=columns)
    with pytest.raises(PackError, match=r"line 2, column 't'.*ISO timestamp.*'s'"):
        pack(mixed, tmp_path / "b", csv=CsvColumns(group="day", order="t", time_unit="s"))
    with pytest.raises(ValueError, match="time unit must be one of"):
        CsvColumns(order="t", time_unit="minutes")  # type: ignore[arg-type]


def test_val_csv_missing_a_onehot_value_keeps_the_training_vocabulary(
    tmp_path: Path, make_image  # type: ignore[no-untyped-def]
) -> None:
    from shardfeed.cli.main import main

    rows = {"train": ["bird", "cat", "dog"], "val": ["bird", "dog"], "odd": ["bird", "eel"]}
    for split, kinds in rows.items():
        lines = ["path,kind"]
        for i, kind in enumerate(kinds):
            make_image(tmp_path / split / f"{i}.jpg", i)
            lines.append(f"{i}.jpg,{kind}")
        (tmp_path / split / "labels.csv").write_text("\n".join(lines) + "\n")

    def hot(out: Path) -> dict[str, list[int]]:
        ds = shardfeed.Dataset(str(out))
        try:
            return {kind: ds[i]["image/label/kind"].tolist() for i, kind in
                    enumerate(rows[out.name.split("_")[0]])}
        finally:
            ds.close()

    args = ["--csv-onehot", "kind", "--no-progress"]
    assert main(["pack", str(tmp_path / "train/labels.csv"), str(tmp_path / "train_out"), *args]) == 0
    assert hot(tmp_path / "train_out")["dog"] == [0, 0, 1]
    # packed on its own, the val split would call dog [0, 1]: another position, another size
    assert main(["pack", str(tmp_path / "val/labels.csv"), str(tmp_path / "val_out"), *args,
                 "--classes-from", str(tmp_path / "train_out")]) == 0
    assert hot(tmp_path / "val_out") == {"bird": [1, 0, 0], "dog": [0, 0, 1]}
    with pytest.raises(PackError, match=r"line 3, column 'kind': 'eel' is not in the vocabulary"):
        pack(tmp_path / "odd/labels.csv", tmp_path / "odd_out",
             csv=CsvColumns(onehot=("kind",)), classes_from=tmp_path / "train_out")
