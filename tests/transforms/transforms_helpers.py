"""Helpers for the transforms tests (a unique module name: tests/ is not a package)."""

from __future__ import annotations

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
