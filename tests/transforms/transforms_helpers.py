"""Helpers for the transforms tests (a unique module name: tests/ is not a package)."""

from __future__ import annotations

from typing import Any

import numpy as np
import simplejpeg


def smooth_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB test picture (gradients + blobs): JPEG keeps it well, resizes behave."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        fy, fx = rng.uniform(1, 4, size=2)
        img[..., c] = 128 + 100 * np.sin(yy / height * fy * np.pi + c) * np.cos(
            xx / width * fx * np.pi
        )
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(image: np.ndarray, quality: int = 92) -> bytes:
    return bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality))


def count_region_decodes(monkeypatch: Any) -> list[bool]:
    """A list that gets, for every region the crop ops ask the region decoder for (a row at
    a time or a slice's rows at once), whether it was decoded."""
    from shardfeed.transforms.decode import crop, crop_rows

    used: list[bool] = []
    one, many = crop.decode_region, crop_rows.decode_regions

    def counted(*args: Any, **kwargs: Any) -> np.ndarray | None:
        result = one(*args, **kwargs)
        used.append(result is not None)
        return result

    def counted_many(*args: Any, **kwargs: Any) -> list[np.ndarray | None]:
        results = many(*args, **kwargs)
        used.extend(r is not None for r in results)
        return results

    monkeypatch.setattr(crop, "decode_region", counted)
    monkeypatch.setattr(crop_rows, "decode_regions", counted_many)
    return used


def jpeg_shard(folder: Any, count: int, make: Any, *, damaged: int | None = None) -> Any:
    """A dataset of ``count`` JPEG records (``make(i)`` the bytes of record ``i``, labels
    ``i % 3``), record ``damaged`` cut to a third."""
    from shardfeed.dataset import Dataset
    from shardfeed.format.writer import ShardWriter

    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(count):
            data = make(i)
            if i == damaged:
                data = data[: len(data) // 3]
            writer.write_example({"image/encoded": data, "image/class/label": [i % 3]})
    return Dataset(str(folder))


def train_batches(ds: Any, **options: Any) -> list[np.ndarray]:
    """The images of two epochs of a train-preset (96 px) loader of batches of 8."""
    from shardfeed.pipeline import Loader
    from shardfeed.transforms import presets

    with Loader(ds, batch_size=8, seed=4, transform=presets.train(size=96), **options) as ld:
        return [np.array(b["image"]) for e in range(2) for b in (ld.set_epoch(e), *ld)[1:]]
