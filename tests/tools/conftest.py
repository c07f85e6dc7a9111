"""Tiny image datasets built in tmp_path for the pack/index/inspect/verify tests."""

from __future__ import annotations

import csv
from pathlib import Path

import cv2
import numpy as np
import pytest


def write_image(path: Path, seed: int, *, size: tuple[int, int] = (20, 24), ext: str = ".jpg",
                gray: bool = False) -> np.ndarray:
    """Write a small deterministic image; return its pixels (RGB or gray)."""
    rng = np.random.default_rng(seed)
    h, w = size
    shape = (h, w) if gray else (h, w, 3)
    pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    bgr = pixels if gray else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode(ext, bgr)
    assert ok
    path.write_bytes(data.tobytes())
    return pixels


@pytest.fixture
def class_folder(tmp_path: Path) -> Path:
    """photos/{cat,dog,emu}/ with 3, 2 and 4 images (JPEG and PNG mixed)."""
    root = tmp_path / "photos"
    counts = {"cat": 3, "dog": 2, "emu": 4}
    seed = 0
    for name, n in counts.items():
        for i in range(n):
            ext = ".png" if i % 2 else ".jpg"
            write_image(root / name / f"{name}{i}{ext}", seed, ext=ext)
            seed += 1
    return root


FLOAT_COLUMNS = ["VF"] + [f"IRR{i}" for i in range(3)]


@pytest.fixture
def frames_csv(tmp_path: Path) -> Path:
    """frames.csv: 12 frames over 3 days, rows shuffled; float, one-hot, mask, group, order."""
    root = tmp_path / "frames"
    rows = []
    k = 0
    for day in ("2024-05-03", "2024-05-01", "2024-05-02"):
        for j in range(4):
            name = f"img/{day}_{j}.jpg"
            write_image(root / name, 100 + k, size=(16 + j, 20))
            mask = f"mask/{day}_{j}.png"
            write_image(root / mask, 200 + k, size=(16 + j, 20), ext=".png", gray=True)
            rows.append({
                "path": name,
                "mask": mask,
                "day": day,
                "timestamp": f"{day}T12:00:{j * 8:02d}",
                "label": str(k % 3),
                "VF": str(k * 0.5),
                **{f"IRR{i}": str(k + i / 10) for i in range(3)},
                "sky": ["clear", "cloudy", "rain"][k % 3],
            })
            k += 1
    order = np.random.default_rng(7).permutation(len(rows))
    path = root / "frames.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for i in order:
            writer.writerow(rows[i])
    return path


@pytest.fixture
def make_image():  # type: ignore[no-untyped-def]
    """The ``write_image`` helper, for tests that build their own files."""
    return write_image
