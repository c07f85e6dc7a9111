"""Tiny real datasets for the pipeline, loader and conformance tests.

Shards are written with the project's ShardWriter and Example codec; images are real JPEGs
(64x48) whose pixels encode the record index, so a batch shows which records it holds.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg

from shardfeed.format.writer import ShardWriter

WIDTH, HEIGHT = 64, 48
BAD_JPEG = b"\xff\xd8\xff\xe0" + b"\x00\x10JFIF" + bytes(range(256)) * 4


def record_image(index: int) -> np.ndarray:
    """A smooth image (JPEG-friendly) whose mean level encodes ``index``."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = (index * 37) % 200
    image = np.stack([base + x // 4, base + y // 4, np.full_like(x, base)], axis=-1)
    return np.clip(image, 0, 255).astype(np.uint8)


def write_dataset(folder: Path, n: int, *, shards: int = 3, bad_jpeg: Sequence[int] = (),
                  bad_crc: Sequence[int] = ()) -> Path:
    """``n`` records over ``shards`` shards in ``folder``; some may hold a bad image or CRC."""
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, n, shards + 1).astype(int)
    for s in range(shards):
        path = folder / f"part-{s:03d}.tfrecord"
        with ShardWriter(str(path)) as writer:
            for i in range(bounds[s], bounds[s + 1]):
                encoded = BAD_JPEG if i in bad_jpeg else simplejpeg.encode_jpeg(
                    record_image(i), quality=95
                )
                writer.write_example({
                    "image/encoded": encoded,
                    "image/format": b"jpeg",
                    "image/filename": f"img{i:04d}.jpg".encode(),
                    "image/height": [HEIGHT],
                    "image/width": [WIDTH],
                    "image/class/label": [i % 5],
                    "index": [i],
                    "labels": np.array([i, i / 2, -i], dtype=np.float32),
                    "day": [i // 10],
                    "timestamp": [float(i % 10) * 8.0],
                })
        for i in bad_crc:
            if bounds[s] <= i < bounds[s + 1]:
                _flip_data_byte(path, i - bounds[s])
    return folder


def _flip_data_byte(path: Path, record: int) -> None:
    offsets = np.load(str(path) + ".idx.npy")
    position = int(offsets[record]) + 12 + 40  # inside the payload
    with open(path, "r+b") as fh:
        fh.seek(position)
        byte = fh.read(1)
        fh.seek(position)
        fh.write(bytes([byte[0] ^ 0xFF]))


class FakeDataset:
    """Stands in for shardfeed.Dataset until it lands: reads the same shard files."""

    schema = None
    root = None

    def __init__(self, folder: Path) -> None:
        from shardfeed.format.example import decode_example
        from shardfeed.format.framing import unframe

        self._unframe = unframe
        self._decode = decode_example
        self.paths = sorted(str(p) for p in Path(folder).glob("*.tfrecord"))
        self.offsets = [np.load(p + ".idx.npy") for p in self.paths]
        counts = [len(o) - 1 for o in self.offsets]
        self.starts = np.concatenate([[0], np.cumsum(counts)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, i: int) -> tuple[str, int, int]:
        s = int(np.searchsorted(self.starts, i, side="right") - 1)
        r = i - int(self.starts[s])
        return self.paths[s], r, int(self.offsets[s][r])

    def read_many(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        out = []
        for i in indices:
            path, r, offset = self.locate(int(i))
            end = int(self.offsets[self.paths.index(path)][r + 1])
            fd = os.open(path, os.O_RDONLY)
            try:
                buf = os.pread(fd, end - offset, offset)
            finally:
                os.close(fd)
            payload = self._unframe(buf, path=path, record=r, offset=offset)
            out.append(self._decode(bytes(payload)))
        return out

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.read_many([i])[0]


def open_dataset(folder: Path) -> Any:
    """The real Dataset when it exists, else the stand-in."""
    try:
        from shardfeed.dataset import Dataset
    except ImportError:
        return FakeDataset(folder)
    return Dataset(str(folder))


class SmallTrain:
    """Decode + random flip + keyed noise: a small train transform with real randomness."""

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from shardfeed.transforms.decode import decode_image

        image = decode_image(sample.pop("image/encoded"))
        if rng.random() < 0.5:
            image = image[:, ::-1]
        sample["image"] = np.ascontiguousarray(image[8:40, 8:56])  # 32x48
        sample["noise"] = rng.random(2).astype(np.float32)
        return sample


def train_transform() -> Any:
    return SmallTrain()


def record_ids(batches: list[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b["index"]).reshape(-1)]
