"""Photos with and without an EXIF orientation tag, packed as a user packs them, for the EXIF
policy tests: the tag is written as the APP1 segment a camera writes (a big-endian TIFF
structure whose first directory holds the Orientation tag), right after the JPEG's SOI."""

from __future__ import annotations

import csv
import io
import struct
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image

import shardfeed
from shardfeed.dataset import Dataset
from shardfeed.tools.pack.csvinput import CsvColumns

HEIGHT, WIDTH = 700, 900
ORIENTATIONS = (2, 3, 6, 8)


def with_orientation(jpeg: bytes, orientation: int, *, order: str = "MM") -> bytes:
    """``jpeg`` with an APP1 Exif segment holding ``orientation`` inserted after its SOI."""
    e = ">" if order == "MM" else "<"
    entry = struct.pack(e + "HHIHH", 0x0112, 3, 1, orientation, 0)  # tag, SHORT, 1 value
    tiff = order.encode() + struct.pack(e + "HI", 42, 8) + struct.pack(e + "H", 1) + entry
    body = b"Exif\x00\x00" + tiff + struct.pack(e + "I", 0)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body + jpeg[2:]


def photo(seed: int, height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """Smooth colour with edges and noise, different in every corner (a turn shows)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 32 + 2, width // 32 + 2, 3), dtype=np.uint8)
    image = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
    noise = rng.integers(-10, 11, image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, *, cmyk: bool = False, quality: int = 92,
           **options: int) -> bytes:
    out = io.BytesIO()
    image = Image.fromarray(pixels)
    (image.convert("CMYK") if cmyk else image).save(out, "JPEG", quality=quality, **options)
    return out.getvalue()


def png(pixels: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", pixels)
    assert ok
    return data.tobytes()


def pack_csv(folder: Path, images: list[bytes], masks: list[bytes] | None) -> Dataset:
    """Write the images (and masks) as files and pack them from a CSV, as a user does."""
    files = folder / "files"
    files.mkdir(parents=True)
    rows = []
    for i, data in enumerate(images):
        (files / f"img{i}.jpg").write_bytes(data)
        row = {"path": f"img{i}.jpg", "label": str(i % 3)}
        if masks is not None:
            (files / f"mask{i}.png").write_bytes(masks[i])
            row["mask"] = f"mask{i}.png"
        rows.append(row)
    table = files / "list.csv"
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    columns = CsvColumns(path="path", labels=("label",),
                         mask="mask" if masks is not None else None)
    shardfeed.pack(str(table), str(folder / "packed"), csv=columns)
    return Dataset(str(folder / "packed"))


def batches(source: Any, transform: Any, *, batch_size: int,
            seed: int) -> list[dict[str, np.ndarray]]:
    """The images (and masks) of two shuffled epochs of a two-thread loader."""
    from shardfeed.pipeline import Loader

    with Loader(source, batch_size=batch_size, shuffle=True, seed=seed, num_threads=2,
                transform=transform) as loader:
        return [{k: np.array(v) for k, v in b.items() if k in ("image", "mask")}
                for e in range(2) for b in (loader.set_epoch(e), *loader)[1:]]


def assert_same(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> None:
    """Equal batches, pixel for pixel (the message gives the mean difference)."""
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].shape == y[key].shape, key
            diff = np.abs(x[key].astype(np.int32) - y[key].astype(np.int32))
            assert diff.max() == 0, f"{key}: off by {diff.mean():.2f} levels on average"
