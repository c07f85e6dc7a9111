"""The demo's source images: three small datasets made from scikit-image's bundled photographs.

Each builder writes image files and a CSV (or a plain folder) that ``pack`` then packs, in the
shapes of the real use cases:

- :func:`write_timelapse`: a camera watching the sky for a few days. Day ``d`` pans across
  one photograph and brightens and darkens it like a day; frames are 8 s apart and some days
  miss a few frames (the camera dropped them), so windows must not bridge the gap. Each
  frame has 23 float labels (``VF`` and ``IRR0..IRR21``: the overall light and the light of
  22 horizontal bands), a ``day`` and an ISO ``timestamp``.
- :func:`write_highres`: a few photographs upscaled to 1024–1566 px on the long side, the
  input of patch sampling.
- :func:`write_labelled`: many small crops, one class per photograph, sorted by label (the
  order that makes a shuffle buffer fail), each with a PNG segmentation mask (bright vs dark).

Determinism: every pixel and every encoded byte is a function of the sizes alone (keyed
Philox generators, OpenCV's deterministic JPEG/PNG encoders): two runs write identical files.
Memory: one photograph and one output image at a time.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import cv2
import numpy as np

from shardfeed.errors import MissingDependencyError, ShardfeedError

__all__ = [
    "TIMELAPSE_FLOATS",
    "DemoSizes",
    "MissingDependencyError",
    "load_photo",
    "write_highres",
    "write_labelled",
    "write_timelapse",
]

#: The photographs the demo uses, by scikit-image name (all bundled, no download).
PHOTOS: tuple[str, ...] = (
    "astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry",
    "hubble_deep_field", "retina", "colorwheel", "cat", "camera",
)

#: The 23 float label columns of a time-lapse frame.
TIMELAPSE_FLOATS: tuple[str, ...] = ("VF", *(f"IRR{i}" for i in range(22)))

FRAME_SECONDS = 8
JPEG_QUALITY = 90
_START = datetime(2024, 6, 1, 6, 0, 0, tzinfo=timezone.utc)


@dataclass(kw_only=True, frozen=True, slots=True)
class DemoSizes:
    """How big the demo datasets are.

    ``days`` × ``frames_per_day`` time-lapse frames of ``frame_size`` (width, height), with
    ``dropped`` frames missing from the middle of every second day; ``highres_images`` large
    photographs; ``labelled_images`` crops of ``crop_pixels`` square in ``classes`` classes.
    """

    days: int = 4
    frames_per_day: int = 40
    frame_size: tuple[int, int] = (256, 192)
    dropped: int = 3
    highres_images: int = 8
    labelled_images: int = 2000
    crop_pixels: int = 64
    classes: int = 10

    def __post_init__(self) -> None:
        for name in ("days", "frames_per_day", "highres_images", "labelled_images",
                     "crop_pixels", "classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DemoSizes.{name} must be an int >= 1, got {value!r}")
        if self.classes > len(PHOTOS):
            raise ValueError(
                f"DemoSizes.classes must be <= {len(PHOTOS)} (one photograph a class), "
                f"got {self.classes}"
            )
        if self.labelled_images < self.classes:
            raise ValueError(
                f"DemoSizes.labelled_images ({self.labelled_images}) must be at least the "
                f"number of classes ({self.classes})"
            )
        if not 0 <= self.dropped <= self.frames_per_day // 2:
            raise ValueError(
                f"DemoSizes.dropped must be in [0, frames_per_day // 2], got {self.dropped}"
            )

    @classmethod
    def quick(cls) -> DemoSizes:
        """A reduced size for tests and a fast look (a few seconds)."""
        return cls(days=3, frames_per_day=12, frame_size=(128, 96), dropped=2,
                   highres_images=4, labelled_images=300, crop_pixels=48, classes=6)


def _skimage_data() -> Any:
    try:
        from skimage import data
    except ImportError:
        raise MissingDependencyError(
            "the demo builds its datasets from scikit-image's bundled photographs, and "
            "scikit-image is not installed: pip install 'shardfeed[demo]' (or scikit-image)"
        ) from None
    return data


def load_photo(name: str) -> np.ndarray:
    """One bundled photograph as H×W×3 uint8 RGB (grey ones repeated over 3 channels)."""
    if name not in PHOTOS:
        raise ValueError(f"unknown demo photo {name!r}; choose one of {PHOTOS}")
    image = np.asarray(getattr(_skimage_data(), name)())
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3].astype(np.uint8))


def _rng(*words: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([20240601, *words])))


def _write_jpeg(path: str, rgb: np.ndarray) -> None:
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                            [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise ShardfeedError(f"OpenCV could not encode '{path}' as JPEG")
    with open(path, "wb") as f:
        f.write(data.tobytes())


def _write_png(path: str, gray: np.ndarray) -> None:
    ok, data = cv2.imencode(".png", gray)
    if not ok:
        raise ShardfeedError(f"OpenCV could not encode '{path}' as PNG")
    with open(path, "wb") as f:
        f.write(data.tobytes())


def _write_csv(path: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def dropped_frames(sizes: DemoSizes, day: int) -> range:
    """Frames the camera missed on ``day``: ``sizes.dropped`` in the middle of odd days."""
    if day % 2 == 0 or sizes.dropped == 0:
        return range(0)
    start = sizes.frames_per_day // 2
    return range(start, start + sizes.dropped)


def _day_light(fraction: float) -> float:
    """Light level over a day: dim at dawn and dusk, brightest at noon."""
    return 0.3 + 0.75 * math.sin(math.pi * (0.08 + 0.84 * fraction))


def write_timelapse(folder: str, sizes: DemoSizes) -> str:
    """Time-lapse frames (JPEG) and ``frames.csv``; returns the CSV path.

    CSV columns: ``path, day, timestamp, VF, IRR0..IRR21``. Rows are written newest day first
    and shuffled within days, so ``pack --csv-group day --csv-order timestamp`` has to sort.
    """
    os.makedirs(os.path.join(folder, "frames"), exist_ok=True)
    width, height = sizes.frame_size
    rows: list[list[Any]] = []
    for day in range(sizes.days):
        photo = load_photo(PHOTOS[day % len(PHOTOS)])
        ph, pw = photo.shape[:2]
        cw, ch = int(pw * 0.6), int(ph * 0.6)
        missing = set(dropped_frames(sizes, day))
        day_rows: list[list[Any]] = []
        for j in range(sizes.frames_per_day):
            if j in missing:
                continue
            fraction = j / max(1, sizes.frames_per_day - 1)
            x = round((pw - cw) * fraction)
            y = round((ph - ch) * (0.5 + 0.5 * math.sin(2 * math.pi * fraction)) / 2)
            crop = cv2.resize(photo[y : y + ch, x : x + cw], (width, height),
                              interpolation=cv2.INTER_AREA)
            light = _day_light(fraction)
            frame = np.clip(crop.astype(np.float32) * light, 0, 255).astype(np.uint8)
            name = f"frames/day{day}_{j:04d}.jpg"
            _write_jpeg(os.path.join(folder, name), frame)
            edges = np.linspace(0, height, 23).astype(int)
            irr = [float(frame[a:b].mean()) / 255 for a, b in itertools.pairwise(edges)]
            stamp = _START + timedelta(days=day, seconds=FRAME_SECONDS * j)
            day_rows.append([
                name, day, stamp.strftime("%Y-%m-%dT%H:%M:%S"), f"{light:.6f}",
                *(f"{v:.6f}" for v in irr),
            ])
        order = _rng(1, day).permutation(len(day_rows))
        rows[:0] = [day_rows[i] for i in order]
    path = os.path.join(folder, "frames.csv")
    _write_csv(path, ["path", "day", "timestamp", *TIMELAPSE_FLOATS], rows)
    return path


def write_highres(folder: str, sizes: DemoSizes) -> str:
    """Large photographs (JPEG, 1024–1566 px on the long side) in ``folder``; returns it."""
    os.makedirs(folder, exist_ok=True)
    for i in range(sizes.highres_images):
        photo = load_photo(PHOTOS[i % len(PHOTOS)])
        ph, pw = photo.shape[:2]
        long_side = 1024 + (i * 181) % 543  # 1024 .. 1566
        scale = long_side / max(ph, pw)
        size = (round(pw * scale), round(ph * scale))
        big = cv2.resize(photo, size, interpolation=cv2.INTER_CUBIC)
        if i >= len(PHOTOS):  # later rounds: mirror, so no two images are the same
            big = np.ascontiguousarray(big[:, ::-1])
        _write_jpeg(os.path.join(folder, f"photo{i:02d}.jpg"), big)
    return folder


def write_labelled(folder: str, sizes: DemoSizes) -> str:
    """Square crops (JPEG) with masks (PNG), sorted by label, and ``labelled.csv``.

    Class ``k`` is crops of photograph ``k``; the mask marks the pixels brighter than the
    crop's mean (1) against the rest (0). CSV columns: ``path, label, mask``, label ascending.
    """
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    os.makedirs(os.path.join(folder, "masks"), exist_ok=True)
    side = sizes.crop_pixels
    per_class = np.full(sizes.classes, sizes.labelled_images // sizes.classes)
    per_class[: sizes.labelled_images % sizes.classes] += 1
    rows: list[list[Any]] = []
    index = 0
    for label in range(sizes.classes):
        photo = load_photo(PHOTOS[label])
        ph, pw = photo.shape[:2]
        rng = _rng(2, label)
        for _ in range(int(per_class[label])):
            crop_side = int(rng.integers(side, min(ph, pw) // 2 + 1))
            y = int(rng.integers(0, ph - crop_side + 1))
            x = int(rng.integers(0, pw - crop_side + 1))
            crop = cv2.resize(photo[y : y + crop_side, x : x + crop_side], (side, side),
                              interpolation=cv2.INTER_AREA)
            gray = cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY)
            mask = (gray > gray.mean()).astype(np.uint8)
            name = f"images/{index:05d}.jpg"
            mask_name = f"masks/{index:05d}.png"
            _write_jpeg(os.path.join(folder, name), crop)
            _write_png(os.path.join(folder, mask_name), mask)
            rows.append([name, label, mask_name])
            index += 1
    path = os.path.join(folder, "labelled.csv")
    _write_csv(path, ["path", "label", "mask"], rows)
    return path
