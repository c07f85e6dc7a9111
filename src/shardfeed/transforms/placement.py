"""Where pixels go: each geometric op as an affine map of image coordinates, and boxes moved by it.

Coordinates are continuous pixel edges: pixel ``(row r, column c)`` covers ``[c, c + 1) ×
[r, r + 1)``, so an image of width ``W`` spans ``x`` in ``[0, W]``. An op's *placement* is the
2×3 matrix ``M`` taking an input point ``(x, y)`` to its output point ``M @ (x, y, 1)``, and the
output's ``(height, width)``. Crops, pads, resizes, flips, quarter turns and affine warps are
all such maps, so one function moves boxes for all of them.

A box is a row ``(x_min, y_min, x_max, y_max)`` in pixels of the current image (float32), the
convention of torchvision's ``XYXY`` boxes. A moved box is the smallest upright box around its
four moved corners, clipped to the output; a box left thinner than ``min_size`` pixels (out of
the frame, or cut to a sliver) is dropped, and with it the same row of every per-box field.

Determinism: pure functions of their arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from shardfeed.errors import SchemaError


@dataclass(frozen=True, slots=True)
class BoxFields:
    """Which sample keys hold boxes (``keys``: N×4 XYXY pixels) and which hold one row a box
    (``fields``: class ids, areas, crowd flags...), dropped with their boxes; boxes thinner than
    ``min_size`` pixels after an op are dropped."""

    keys: tuple[str, ...] = ("boxes",)
    fields: tuple[str, ...] = ("box_labels",)
    min_size: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.keys, str) or isinstance(self.fields, str):
            raise TypeError("BoxFields keys and fields are tuples of names, e.g. ('boxes',)")
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "fields", tuple(self.fields))
        if not self.min_size >= 0:
            raise ValueError(f"min_size is a number of pixels >= 0, got {self.min_size!r}")


class Placement(NamedTuple):
    """An op's map of input coordinates to output coordinates, and the output's size."""

    matrix: np.ndarray  # 2×3 float64
    out_hw: tuple[int, int]


def affine(a: float, b: float, c: float, d: float, e: float, f: float,
           out_hw: tuple[int, int]) -> Placement:
    """``x' = a·x + b·y + c``, ``y' = d·x + e·y + f``."""
    return Placement(np.array([[a, b, c], [d, e, f]], dtype=np.float64), out_hw)


def shift_scale(dx: float, dy: float, sx: float, sy: float,
                out_hw: tuple[int, int]) -> Placement:
    """Translate by ``(dx, dy)`` then scale by ``(sx, sy)``: crops, pads and resizes."""
    return affine(sx, 0.0, dx * sx, 0.0, sy, dy * sy, out_hw)


def hflip(height: int, width: int) -> Placement:
    return affine(-1.0, 0.0, float(width), 0.0, 1.0, 0.0, (height, width))


def vflip(height: int, width: int) -> Placement:
    return affine(1.0, 0.0, 0.0, 0.0, -1.0, float(height), (height, width))


def quarter_turns(k: int, height: int, width: int) -> Placement:
    """``np.rot90(image, k)``: ``k`` turns counter-clockwise (``k`` in 0..3)."""
    k %= 4
    if k == 0:
        return affine(1.0, 0.0, 0.0, 0.0, 1.0, 0.0, (height, width))
    if k == 1:  # (x, y) -> (y, W - x)
        return affine(0.0, 1.0, 0.0, -1.0, 0.0, float(width), (width, height))
    if k == 2:
        return affine(-1.0, 0.0, float(width), 0.0, -1.0, float(height), (height, width))
    return affine(0.0, -1.0, float(height), 1.0, 0.0, 0.0, (width, height))  # (H - y, x)


def then(first: Placement, second: Placement) -> Placement:
    """``first``, then ``second`` (applied to ``first``'s output)."""
    a = np.vstack([first.matrix, [0.0, 0.0, 1.0]])
    b = np.vstack([second.matrix, [0.0, 0.0, 1.0]])
    return Placement((b @ a)[:2], second.out_hw)


def from_cv2(matrix: np.ndarray, out_hw: tuple[int, int]) -> Placement:
    """The placement of ``cv2.warpAffine(src, matrix, ...)``: OpenCV's matrix maps pixel
    *centres* (integer coordinates); edges sit half a pixel off."""
    m = np.asarray(matrix, dtype=np.float64).reshape(2, 3).copy()
    m[:, 2] += 0.5 - 0.5 * (m[:, 0] + m[:, 1])
    return Placement(m, out_hw)


def move_boxes(boxes: np.ndarray, placement: Placement, *,
               min_size: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The boxes moved by ``placement`` and clipped to its output, and the indices of the
    input rows kept (those at least ``min_size`` pixels wide and high after clipping)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    corners = np.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [0, 3]], b[:, [2, 3]]], axis=1)
    m = placement.matrix
    moved = corners @ m[:, :2].T + m[:, 2]
    h, w = placement.out_hw
    lo = moved.min(axis=1)
    hi = moved.max(axis=1)
    x0 = np.clip(lo[:, 0], 0, w)
    y0 = np.clip(lo[:, 1], 0, h)
    x1 = np.clip(hi[:, 0], 0, w)
    y1 = np.clip(hi[:, 1], 0, h)
    keep = np.flatnonzero((x1 - x0 >= min_size) & (y1 - y0 >= min_size))
    out = np.stack([x0, y0, x1, y1], axis=1)[keep].astype(np.float32)
    return out, keep


def check_boxes(value: Any, key: str) -> np.ndarray:
    """``value`` as an N×4 float array, or a SchemaError naming ``key``."""
    arr = np.asarray(value)
    if arr.size == 0:
        return np.zeros((0, 4), dtype=np.float32)
    if arr.ndim != 2 or arr.shape[1] != 4 or arr.dtype.kind not in "iuf":
        raise SchemaError(f"'{key}' holds {arr.dtype} of shape {arr.shape}; boxes are N×4 "
                          "numbers (x_min, y_min, x_max, y_max) in pixels")
    return arr


def apply_to_boxes(sample: dict[str, Any], placement: Placement, boxes: BoxFields, *,
                   op: str) -> None:
    """Move every box key of ``boxes`` present in ``sample``; drop the rows of the per-box
    fields that its dropped boxes leave."""
    for key in boxes.keys:
        if key not in sample:
            continue
        given = check_boxes(sample[key], key)
        moved, keep = move_boxes(given, placement, min_size=boxes.min_size)
        sample[key] = moved
        for field in boxes.fields:
            if field not in sample:
                continue
            values = np.asarray(sample[field])
            if values.shape[:1] != given.shape[:1]:
                rows = values.shape[0] if values.ndim else 0
                raise SchemaError(f"{op}: '{field}' has {rows} rows and '{key}' {len(given)} "
                                  "boxes; a per-box field has one row a box")
            sample[field] = values[keep]


def has_boxes(sample: Any, boxes: BoxFields) -> bool:
    return any(key in sample for key in boxes.keys)


__all__ = ["BoxFields", "Placement", "affine", "apply_to_boxes", "check_boxes", "from_cv2", "has_boxes", "hflip",
           "move_boxes", "quarter_turns", "shift_scale", "then", "vflip"]
