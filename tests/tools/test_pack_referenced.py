"""pack --mode referenced writes datasets its own readers open, or says why not before writing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import shardfeed
from shardfeed.errors import PackError, UnsafePathError
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.csvinput import CsvColumns
from shardfeed.tools.verify import verify


def _csv(folder: Path, paths: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / "labels.csv"
    csv.write_text("path,label\n" + "".join(f"{p},0\n" for p in paths))
    return csv


def test_csv_paths_outside_the_root_are_refused_with_the_root_to_pass(
    tmp_path: Path, make_image  # type: ignore[no-untyped-def]
) -> None:
    for i in range(3):
        make_image(tmp_path / "images" / f"{i}.jpg", i)
    csv = _csv(tmp_path / "lists", [f"../images/{i}.jpg" for i in range(3)])
    columns = CsvColumns(labels=("label",))
    # stored as absolute paths, these records would be refused by every reader
    with pytest.raises(PackError, match=r"3 image paths .* lie outside the root .*--root"):
        pack(csv, tmp_path / "ds", mode="referenced", csv=columns)
    assert not (tmp_path / "ds").exists()
    # with the root the message names, the dataset reads and decodes without any opt-in
    listed = _csv(tmp_path / "lists2", [f"images/{i}.jpg" for i in range(3)])
    pack(listed, tmp_path / "ds", mode="referenced", csv=columns, root=tmp_path)
    report = verify(str(tmp_path / "ds"), decode=True)
    assert report.ok and sum(s.decoded for s in report.shards) == 3


def test_a_root_far_from_the_dataset_is_announced_at_pack_time(
    tmp_path: Path, make_image, caplog: pytest.LogCaptureFixture  # type: ignore[no-untyped-def]
) -> None:
    make_image(tmp_path / "photos" / "cat" / "0.jpg", 0)
    out = tmp_path / "elsewhere" / "deep" / "ds"
    with caplog.at_level(logging.WARNING, logger="shardfeed.tools.pack"):
        pack(tmp_path / "photos", out, mode="referenced")
    assert "allow_outside_paths=True" in caplog.text and str(tmp_path / "photos") in caplog.text
    with pytest.raises(UnsafePathError):
        shardfeed.Dataset(str(out))[0]
    with shardfeed.Dataset(str(out), root=str(tmp_path / "photos")) as ds:  # as the warning says
        assert ds[0]["image/path"] == b"cat/0.jpg"
