"""``examples``: the small files that the examples of README.md and docs/ work on.

:func:`write_examples` fills a new (or empty) folder with what the guides' examples read, so
that every example runs as written in that folder (``shardfeed examples ex/ && cd ex/``)::

    photos/       class sub-folders cat/, dog/, fox/ of 12 JPEGs each (48x64, height x width)
    masks/        one PNG mask per photo, same names (1 where brighter than the photo's mean)
    labels.csv    path,label,root,leaf,mask: int label, two categorical columns, mask path
    frames/       time-lapse frames (40x40): 3 days of 10 frames 8 s apart, frame 6 of day 1
                  missing (a 16 s gap)
    frames.csv    path,day,timestamp,VF,IRR0..IRR3: day group, ISO timestamps, 5 floats
    large/        6 JPEGs of 192x256, for patches
    out/          photos/ packed: 36 records, 12 a shard (3 shards)
    days/         frames.csv packed with day as the group and timestamp as the order key
    big/          large/ packed, 3 records a shard
    existing/     mixed.tfrecord (21 records) and second.tfrecord (9), written by TensorFlow,
                  with no index
    old/          compressed.tfrecord.gz: 5 records written by TensorFlow with GZIP
    damaged/      mixed.tfrecord damaged three ways: data-crc.tfrecord (one byte of record
                  2's data flipped), length-crc.tfrecord (one byte of record 4's length
                  flipped), truncated.tfrecord (cut inside record 5)

The TensorFlow-written files are package data (``example_files/``, copies of the project's
test fixtures, see the README there); the damaged ones are made from ``mixed.tfrecord`` by the
same byte changes as those fixtures. Only core dependencies are needed: the pictures are smooth
random images (NumPy, OpenCV), not photographs.

Determinism: every pixel is drawn from a Philox generator keyed by the file's role and
number, and images are encoded by OpenCV: two runs with the same library builds write
identical files. State: none. Memory: one image at a time, and what ``pack`` holds.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import cv2
import numpy as np

from shardfeed.tools.demo.data import _write_csv, _write_jpeg, _write_png

__all__ = ["CLASSES", "EXAMPLE_FILES", "ExampleFiles", "tensorflow_file", "write_examples"]

#: What :func:`write_examples` makes, by name, with a one-line description.
EXAMPLE_FILES: dict[str, str] = {
    "photos/": "class sub-folders cat/, dog/, fox/ of 12 JPEGs each (48x64)",
    "masks/": "one PNG mask per photo, same names",
    "labels.csv": "path,label,root,leaf,mask for the photos",
    "frames/": "time-lapse frames: 3 days of 10, 8 s apart, one missing on day 1",
    "frames.csv": "path,day,timestamp,VF,IRR0..IRR3 for the frames",
    "large/": "6 JPEGs of 192x256, for patches",
    "out/": "photos/ packed: 36 records in 3 shards",
    "days/": "frames.csv packed with day as group, timestamp as order key",
    "big/": "large/ packed, 3 records a shard",
    "existing/": "mixed.tfrecord, second.tfrecord: written by TensorFlow, no index",
    "old/": "compressed.tfrecord.gz: written by TensorFlow with GZIP",
    "damaged/": "data-crc, length-crc, truncated: damaged TFRecord files",
}

CLASSES: tuple[str, ...] = ("cat", "dog", "fox")
PHOTOS_PER_CLASS = 12
PHOTO_SIZE = (64, 48)  # width, height
DAYS = 3
FRAMES_PER_DAY = 10
FRAME_SECONDS = 8
MISSING_FRAME = (1, 6)  # (day, frame): the camera dropped it
FRAME_SIZE = (40, 40)
FRAME_FLOATS: tuple[str, ...] = ("VF", "IRR0", "IRR1", "IRR2", "IRR3")
LARGE_IMAGES = 6
LARGE_SIZE = (256, 192)
_START = datetime(2024, 5, 1, 6, 0, 0, tzinfo=timezone.utc)

# The damage of the project's TensorFlow fixtures (tests/data/tf/damaged-*.tfrecord), as
# (byte offset, XOR mask) flips of mixed.tfrecord, or a length to cut it to.
_DATA_CRC_FLIP = (7896, 0x40)  # inside record 2's data
_LENGTH_CRC_FLIP = (16381, 0x01)  # inside record 4's length field
_TRUNCATED_BYTES = 22461  # inside record 5
_TF_FILES = ("mixed.tfrecord", "second.tfrecord", "compressed.tfrecord.gz")


@dataclass(frozen=True, slots=True)
class ExampleFiles:
    """What :func:`write_examples` wrote: the folder and the names in it (``EXAMPLE_FILES``)."""

    folder: str
    names: tuple[str, ...]


def _rng(*words: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([20240501, *words])))


def _picture(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A smooth random RGB picture of ``size`` (width, height): compresses like a photograph."""
    width, height = size
    small = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    return np.ascontiguousarray(cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR))


def _mask(rgb: np.ndarray) -> np.ndarray:
    gray: np.ndarray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    mask: np.ndarray = (gray > gray.mean()).astype(np.uint8)
    return mask


def _write_photos(root: str) -> None:
    rows: list[Sequence[Any]] = []
    for label, name in enumerate(CLASSES):
        os.makedirs(os.path.join(root, "photos", name))
        os.makedirs(os.path.join(root, "masks", name))
        for i in range(PHOTOS_PER_CLASS):
            photo, mask = f"photos/{name}/{i:03d}.jpg", f"masks/{name}/{i:03d}.png"
            pixels = _picture(_rng(1, label, i), PHOTO_SIZE)
            _write_jpeg(os.path.join(root, photo), pixels)
            _write_png(os.path.join(root, mask), _mask(pixels))
            rows.append([photo, label, "animal" if name == "fox" else "pet", name, mask])
    _write_csv(os.path.join(root, "labels.csv"), ["path", "label", "root", "leaf", "mask"], rows)


def _write_frames(root: str) -> None:
    rows: list[Sequence[Any]] = []
    for day in range(DAYS):
        os.makedirs(os.path.join(root, "frames", f"day{day}"))
        for k in range(FRAMES_PER_DAY):
            if (day, k) == MISSING_FRAME:
                continue
            rng = _rng(2, day, k)
            frame = f"frames/day{day}/{k:03d}.jpg"
            _write_jpeg(os.path.join(root, frame), _picture(rng, FRAME_SIZE))
            stamp = _START + timedelta(days=day, seconds=FRAME_SECONDS * k)
            values = [f"{v:.4f}" for v in rng.random(len(FRAME_FLOATS))]
            rows.append([frame, day, stamp.strftime("%Y-%m-%dT%H:%M:%S"), *values])
    _write_csv(os.path.join(root, "frames.csv"), ["path", "day", "timestamp", *FRAME_FLOATS],
               rows)


def _write_large(root: str) -> None:
    os.makedirs(os.path.join(root, "large"))
    for i in range(LARGE_IMAGES):
        _write_jpeg(os.path.join(root, "large", f"{i:02d}.jpg"), _picture(_rng(3, i), LARGE_SIZE))


def _pack(root: str) -> None:
    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.csvinput import CsvColumns

    pack(os.path.join(root, "photos"), os.path.join(root, "out"), records_per_shard=12)
    pack(os.path.join(root, "frames.csv"), os.path.join(root, "days"), records_per_shard=16,
         csv=CsvColumns(path="path", group="day", order="timestamp", floats=FRAME_FLOATS))
    pack(os.path.join(root, "large"), os.path.join(root, "big"), records_per_shard=3)


def tensorflow_file(name: str) -> bytes:
    """The bytes of one TensorFlow-written file shipped with shardfeed (``_TF_FILES``)."""
    if name not in _TF_FILES:
        raise ValueError(f"unknown example file {name!r}; choose one of {_TF_FILES}")
    return (resources.files("shardfeed.tools.demo") / "example_files" / name).read_bytes()


def _flip(data: bytes, at: tuple[int, int]) -> bytes:
    offset, mask = at
    return data[:offset] + bytes([data[offset] ^ mask]) + data[offset + 1 :]


def _write_tensorflow_files(root: str) -> None:
    def put(name: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)

    mixed = tensorflow_file("mixed.tfrecord")
    put("existing/mixed.tfrecord", mixed)
    put("existing/second.tfrecord", tensorflow_file("second.tfrecord"))
    put("old/compressed.tfrecord.gz", tensorflow_file("compressed.tfrecord.gz"))
    put("damaged/data-crc.tfrecord", _flip(mixed, _DATA_CRC_FLIP))
    put("damaged/length-crc.tfrecord", _flip(mixed, _LENGTH_CRC_FLIP))
    put("damaged/truncated.tfrecord", mixed[:_TRUNCATED_BYTES])


def _check_folder(folder: str) -> None:
    if not os.path.lexists(folder):
        return
    if not os.path.isdir(folder):
        raise ValueError(
            f"'{folder}' exists and is not a folder: name a new folder for the example files"
        )
    if os.listdir(folder):
        raise ValueError(
            f"'{folder}' is not empty; the example files go into a new or empty folder, so "
            "that nothing in it is overwritten: name another folder"
        )


def write_examples(folder: str | os.PathLike[str]) -> ExampleFiles:
    """Write the example files (see the module docstring) into ``folder``; return what it wrote.

    ``folder`` must be new or empty; anything else raises ``ValueError`` and nothing is
    written. The files are built in a hidden sibling folder and moved into place once
    complete, so an interrupted run leaves no half-written file in ``folder``.
    """
    folder = os.path.abspath(os.fspath(folder))
    _check_folder(folder)
    parent, name = os.path.split(folder)
    os.makedirs(parent, exist_ok=True)
    building = os.path.join(parent, f".{name}.building-{os.getpid()}")
    if os.path.lexists(building):
        shutil.rmtree(building)
    os.makedirs(building)
    try:
        _write_photos(building)
        _write_frames(building)
        _write_large(building)
        _pack(building)
        _write_tensorflow_files(building)
        _check_folder(folder)  # still new or empty: nothing appeared while building
        if os.path.lexists(folder):
            # Fill the folder itself rather than replace it: it may be someone's working
            # directory (``shardfeed examples .``).
            for entry in sorted(os.listdir(building)):
                os.rename(os.path.join(building, entry), os.path.join(folder, entry))
            os.rmdir(building)
        else:
            os.rename(building, folder)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return ExampleFiles(folder=folder, names=tuple(EXAMPLE_FILES))
