"""A Loader whose every kept feature is bytes (only the file names, or a referenced dataset's
paths) and no transform: batches are lists of those values, every record once, the last
partial batch kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfeed.dataset import Dataset
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader

RECORDS = 10


def _write(folder: Path) -> Path:
    folder.mkdir()
    for shard, ids in enumerate((range(6), range(6, RECORDS))):
        with ShardWriter(str(folder / f"part-{shard}.tfrecord")) as writer:
            for i in ids:
                writer.write_example({"image/path": f"photos/{i:03d}.jpg",
                                      "image/filename": f"{i:03d}.jpg", "label": [i % 3]})
    return folder


@pytest.mark.parametrize("key", ["image/filename", "image/path"])
@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_only_bytes_features_batch_as_lists(tmp_path: Path, key: str, workers: str) -> None:
    ds = Dataset(_write(tmp_path / "names"), features=[key])
    with Loader(ds, batch_size=4, transform=None, shuffle=False, workers=workers) as loader:
        batches = list(loader)
    assert [sorted(b) for b in batches] == [[key]] * 3
    assert [len(b[key]) for b in batches] == [4, 4, 2]
    prefix = "photos/" if key == "image/path" else ""
    assert [v for b in batches for v in b[key]] == [
        f"{prefix}{i:03d}.jpg".encode() for i in range(RECORDS)]


def test_only_bytes_features_shuffled(tmp_path: Path) -> None:
    ds = Dataset(_write(tmp_path / "names"), features=["image/filename"])
    with Loader(ds, batch_size=3, transform=None, shuffle=True, seed=4,
                drop_last=True) as loader:
        names = [v for b in loader for v in b["image/filename"]]
    assert len(names) == 9 and len(set(names)) == 9
    assert set(names) <= {f"{i:03d}.jpg".encode() for i in range(RECORDS)}
