"""Fixtures for the command-line tests: a small CSV dataset of images."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    """data/d.csv: 6 JPEGs over 2 days with an int label and two float columns."""
    root = tmp_path / "data"
    root.mkdir()
    lines = ["path,label,F0,F1,day,t"]
    rng = np.random.default_rng(3)
    for i in range(6):
        pixels = rng.integers(0, 256, (12, 14, 3), dtype=np.uint8)
        _ok, data = cv2.imencode(".jpg", pixels)
        (root / f"im{i}.jpg").write_bytes(data.tobytes())
        lines.append(f"im{i}.jpg,{i % 2},{i}.5,{-i},{'ab'[i % 2]},{10 - i}")
    path = root / "d.csv"
    path.write_text("\n".join(lines) + "\n")
    return path
