"""Tiny real datasets for the pipeline, loader and conformance tests.

Shards are written with the project's ShardWriter and Example codec; images are real JPEGs
(64x48) whose pixels encode the record index, so a batch shows which records it holds.
"""

from __future__ import annotations

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


def open_dataset(folder: Path) -> Any:
    """The real Dataset over the shards of ``folder``."""
    from shardfeed.dataset import Dataset

    return Dataset(str(folder))


class SmallTrain:
    """Decode + random flip + keyed noise: a small train transform with real randomness."""

    def __call__(self, sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        from shardfeed.transforms.decode.image import decode_image

        image = decode_image(sample.pop("image/encoded"))
        if rng.random() < 0.5:
            image = image[:, ::-1]
        sample["image"] = np.ascontiguousarray(image[8:40, 8:56])  # 32x48
        sample["noise"] = rng.random(2).astype(np.float32)
        return sample


def train_transform(size: int = 32) -> Any:
    """The train preset (crop-aware decode, random resized crop, flip) at ``size``."""
    from shardfeed.transforms import presets

    return presets.train(size=size)


def keyed_transform() -> Any:
    """A transform whose random draws are visible in the batch (``"noise"``)."""
    return SmallTrain()


def record_ids(batches: list[dict[str, Any]]) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b["index"]).reshape(-1)]


def collect(loader: Any) -> list[dict[str, Any]]:
    """Every batch of ``loader``, copied (arrays as arrays, lists as lists); closes it."""
    with loader:
        return [{k: np.array(v) if isinstance(v, np.ndarray) else list(v)
                 for k, v in batch.items()} for batch in loader]


def assert_same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """The two runs gave the same batches: keys, dtypes, values."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], np.ndarray):
                assert x[key].dtype == y[key].dtype, key
                np.testing.assert_array_equal(x[key], y[key], err_msg=key)
            else:
                assert x[key] == y[key], key
