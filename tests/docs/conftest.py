"""Fixtures of the documentation tests: the small files every example of the docs works on.

The examples in README.md and docs/*.md refer to these names, relative to the folder they run
in:

=================  =====================================================================
``photos/``        class sub-folders ``cat/``, ``dog/``, ``fox/`` of 12 JPEGs each (48x64)
``masks/``         one PNG mask per photo, same name (for the CSV examples)
``labels.csv``     ``path,label,root,leaf,mask``: int label, two one-hot columns, mask path
``frames/``        time-lapse frames: 3 days of 10 JPEGs, 8 s apart (one frame missing on
                   day 1: a gap)
``frames.csv``     ``path,day,timestamp,VF,IRR0..IRR3``: day group, ISO timestamps, floats
``large/``         6 JPEGs of 192x256 (for patches)
``out/``           ``photos/`` packed (embedded, 12 records a shard)
``days/``          ``frames.csv`` packed with ``day`` as group and ``timestamp`` as order key
``big/``           ``large/`` packed
``existing/``      ``mixed.tfrecord`` and ``second.tfrecord``, written by TensorFlow, no index
``old/``           ``compressed.tfrecord.gz``, written by TensorFlow with GZIP
``damaged/``       TensorFlow's files with a bad data CRC, a bad length CRC, a truncation
=================  =====================================================================
"""

from __future__ import annotations

import csv
import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest


def _picture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A smooth random RGB picture (compresses like a photograph, not like noise)."""
    small = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    import cv2

    return np.ascontiguousarray(
        cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)
    )


def _write_jpeg(path: Path, pixels: np.ndarray) -> None:
    import simplejpeg

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(simplejpeg.encode_jpeg(pixels, quality=85))


def _write_png(path: Path, gray: np.ndarray) -> None:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    ok, data = cv2.imencode(".png", gray)
    assert ok
    path.write_bytes(data.tobytes())


def build_workspace(root: Path, tf_fixtures: Path) -> None:
    """Write every file the documentation's examples use into ``root``."""
    import shardfeed
    from shardfeed.tools.csvinput import CsvColumns

    rng = np.random.default_rng(20240501)
    classes = ("cat", "dog", "fox")
    rows = []
    for c, name in enumerate(classes):
        for i in range(12):
            rel = f"photos/{name}/{i:03d}.jpg"
            _write_jpeg(root / rel, _picture(rng, 48, 64))
            mask = f"masks/{name}/{i:03d}.png"
            _write_png(root / mask, (rng.integers(0, 4, (48, 64)) * 60).astype(np.uint8))
            rows.append([rel, c, ("animal", "pet")[c < 2], name, mask])
    with open(root / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label", "root", "leaf", "mask"])
        writer.writerows(rows)

    start = datetime(2024, 5, 1, 6, 0, 0, tzinfo=timezone.utc)
    irr = [f"IRR{i}" for i in range(4)]
    frame_rows = []
    for day in range(3):
        for k in range(10):
            if day == 1 and k == 6:
                continue  # a dropped frame: a 16 s gap on day 1
            rel = f"frames/day{day}/{k:03d}.jpg"
            _write_jpeg(root / rel, _picture(rng, 40, 40))
            stamp = start + timedelta(days=day, seconds=8 * k)
            values = rng.random(len(irr) + 1).round(4).tolist()
            frame_rows.append([rel, day, stamp.strftime("%Y-%m-%dT%H:%M:%S"), *values])
    with open(root / "frames.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "day", "timestamp", "VF", *irr])
        writer.writerows(frame_rows)

    for i in range(6):
        _write_jpeg(root / f"large/{i:02d}.jpg", _picture(rng, 192, 256))

    shardfeed.pack(str(root / "photos"), str(root / "out"), records_per_shard=12)
    shardfeed.pack(
        str(root / "frames.csv"), str(root / "days"), records_per_shard=16,
        csv=CsvColumns(path="path", group="day", order="timestamp", floats=("VF", "IRR0", "IRR1", "IRR2", "IRR3")),
    )
    shardfeed.pack(str(root / "large"), str(root / "big"), records_per_shard=3)

    (root / "existing").mkdir()
    for name in ("mixed.tfrecord", "second.tfrecord"):
        shutil.copy(tf_fixtures / name, root / "existing" / name)
    (root / "old").mkdir()
    shutil.copy(tf_fixtures / "compressed.tfrecord.gz", root / "old" / "compressed.tfrecord.gz")
    (root / "damaged").mkdir()
    for name in ("data-crc", "length-crc", "truncated"):
        shutil.copy(tf_fixtures / f"damaged-{name}.tfrecord", root / "damaged" / f"{name}.tfrecord")


@pytest.fixture(scope="session")
def docs_workspace(tmp_path_factory: pytest.TempPathFactory, tf_fixtures: Path) -> Path:
    """The files of the examples, built once; copy before use (examples write into it)."""
    root = tmp_path_factory.mktemp("docs-workspace")
    build_workspace(root, tf_fixtures)
    return root


@pytest.fixture()
def workspace(docs_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the example files, made the current directory."""
    here = tmp_path / "work"
    shutil.copytree(docs_workspace, here)
    monkeypatch.chdir(here)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return Path(os.getcwd())
