"""Boxes in and out: read per-object boxes stored in records, and pad them for batches.

Object-detection records (TensorFlow's Object Detection API writes them so) keep one float
list a coordinate, one value an object, normalised to the image::

    image/object/bbox/xmin  [0.10, 0.52]        ReadBoxes()      boxes       float32 N×4
    image/object/bbox/ymin  [0.20, 0.31]   ->   (pixels of  ->   box_labels  int64 N
    image/object/bbox/xmax  [0.45, 0.98]         the image)
    image/object/bbox/ymax  [0.66, 0.90]
    image/object/class/label [3, 17]

:class:`ReadBoxes` turns them into the ``boxes`` (XYXY pixels) and ``box_labels`` that every
geometric op moves (:mod:`shardfeed.transforms.placement`). Put it first: it needs only the
image's size, read from the decoded image, else from the encoded image's header, else (raw
pixels) from the ``image/height`` / ``image/width`` features. :class:`PadBoxes`, last, gives every sample
the same shapes, so batches hold arrays (NumPy, torch, JAX) with a count::

    boxes       float32 (B, max_boxes, 4)    rows past a sample's count hold ``fill``
    box_labels  int64   (B, max_boxes)       rows past the count hold ``label_fill`` (-1)
    num_boxes   int64   (B,)                 how many rows of each sample are boxes

Determinism: pure functions of the sample. State: none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.transforms.base import Sample, TransformBase
from shardfeed.transforms.decode.orientation import (
    ExifOrientation,
    check_exif_orientation,
    orientation_of,
    oriented_size,
)
from shardfeed.transforms.decode.sizes import Unsized, claimed_size
from shardfeed.transforms.placement import BoxFields

_OD = "image/object/bbox/"
_SLACK = 0.01  # normalised coordinates a little past the edge are clipped, not refused


class ReadBoxes(TransformBase):
    """Read boxes stored as four per-object lists into ``boxes`` (N×4 XYXY pixels, float32)
    and, with ``labels``, their classes into ``box_labels`` (int64).

    ``normalized=True`` (TF Object Detection records): coordinates are fractions of the
    image's width and height; values beyond ``[-0.01, 1.01]`` are refused (they are pixels:
    pass ``normalized=False``). Boxes are clipped to the image. A record without the lists
    has no boxes. ``keep``: keep the stored lists (default: dropped, since no geometric op
    moves them). ``out``: the output names (default :class:`BoxFields`'s ``boxes`` and first
    field). A list of another length, a NaN or a box with its min past its max is a
    SchemaError naming the feature. ``exif_orientation``: the decode's (see
    :class:`~shardfeed.transforms.decode.ops.DecoderBase`); with ``"apply"`` a tagged JPEG's
    size read from its header is its size as shown (height and width swapped for
    orientations 5-8), the image the decode then crops and the boxes are taken to be in.
    """

    __slots__ = ("exif_orientation", "image_key", "keep", "keys", "labels", "normalized",
                 "out")
    draws_random = False

    def __init__(self, *, xmin: str = _OD + "xmin", ymin: str = _OD + "ymin",
                 xmax: str = _OD + "xmax", ymax: str = _OD + "ymax",
                 labels: str | None = "image/object/class/label", normalized: bool = True,
                 image_key: str = "image", keep: bool = False,
                 out: BoxFields | None = None,
                 exif_orientation: ExifOrientation = "ignore") -> None:
        check_exif_orientation(exif_orientation)
        self.exif_orientation: ExifOrientation = exif_orientation
        self.keys = (xmin, ymin, xmax, ymax)
        self.labels = labels
        self.normalized = bool(normalized)
        self.image_key = image_key
        self.keep = bool(keep)
        self.out = out or BoxFields()
        if not self.out.keys or (labels is not None and not self.out.fields):
            raise ValueError("out must name a box key (and a field for the labels)")

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        columns = [_floats(sample.get(key), key) for key in self.keys]
        count = len(columns[0])
        for key, column in zip(self.keys, columns):
            if len(column) != count:
                raise SchemaError(f"'{key}' holds {len(column)} values and '{self.keys[0]}' "
                                  f"{count}: the box lists hold one value an object each")
        boxes = np.stack(columns, axis=1) if count else np.zeros((0, 4), dtype=np.float64)
        if count:
            height, width = self._size(sample)
            boxes = self._pixels(boxes, height, width)
        out = dict(sample)
        out[self.out.keys[0]] = boxes.astype(np.float32)
        if self.labels is not None:
            labels = np.asarray(sample.get(self.labels, np.zeros(0, dtype=np.int64)))
            if labels.reshape(-1).shape != (count,) or labels.dtype.kind not in "iu":
                raise SchemaError(f"'{self.labels}' holds {labels.dtype} {labels.shape} for "
                                  f"{count} boxes: one integer class an object")
            out[self.out.fields[0]] = labels.reshape(-1).astype(np.int64)
        if not self.keep:
            for key in (*self.keys, *((self.labels,) if self.labels else ())):
                out.pop(key, None)
        return out

    def _pixels(self, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
        if not np.isfinite(boxes).all():
            raise SchemaError(f"a box in '{_OD}...' is not a finite number (NaN or inf)")
        if (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
            row = int(np.flatnonzero((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1]))[0])
            raise SchemaError(f"box {row} is {boxes[row].tolist()} (xmin, ymin, xmax, ymax): "
                              "its max is before its min")
        if self.normalized:
            if boxes.min() < -_SLACK or boxes.max() > 1 + _SLACK:
                raise SchemaError(
                    f"box coordinates reach {boxes.min():g}..{boxes.max():g}, outside 0..1: "
                    "they look like pixels; pass ReadBoxes(normalized=False)")
            boxes = boxes * np.array([width, height, width, height], dtype=np.float64)
        clipped: np.ndarray = np.clip(boxes, 0, [width, height, width, height])
        return clipped

    def _size(self, sample: Sample) -> tuple[int, int]:
        """The image's (height, width): the decoded image's; else the encoded image's header
        (what the decode will give, whatever the record's size features say); else, for
        bytes without a readable header (raw pixels), ``image/height`` and ``image/width``."""
        image = sample.get(self.image_key)
        if isinstance(image, np.ndarray) and image.ndim >= 2 and image.dtype != object:
            return int(image.shape[0]), int(image.shape[1])
        encoded = sample.get("image/encoded", image)
        reason = "the sample has no decoded or encoded image"
        if isinstance(encoded, (bytes, memoryview)):
            try:
                claim = claimed_size(encoded)
                turn = orientation_of(encoded, self.exif_orientation)
                return oriented_size(claim.height, claim.width, turn)
            except Unsized as exc:
                reason = str(exc)
        height, width = sample.get("image/height"), sample.get("image/width")
        if height is not None and width is not None:
            return int(np.asarray(height).reshape(-1)[0]), int(np.asarray(width).reshape(-1)[0])
        raise SchemaError(f"ReadBoxes needs the image's size: {reason}, and there is no "
                          "image/height and image/width")

    def __repr__(self) -> str:
        return f"ReadBoxes(normalized={self.normalized}, labels={self.labels!r})"


def _floats(value: Any, key: str) -> np.ndarray:
    if value is None:
        return np.zeros(0, dtype=np.float64)
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        raise SchemaError(f"'{key}' holds {array.dtype}; box coordinates are numbers")
    return array.reshape(-1).astype(np.float64)


class PadBoxes(TransformBase):
    """Pad boxes and their per-box fields to ``max_boxes`` rows and add their count, so that
    batches hold arrays: ``boxes`` (max_boxes×4, ``fill``), each field (``label_fill`` for
    integers, ``fill`` for floats) and ``count_key`` (int64).

    A sample with more boxes is a SchemaError naming the count (raise ``max_boxes``), or with
    ``overflow="truncate"`` keeps its first ``max_boxes``.
    """

    __slots__ = ("boxes", "count_key", "fill", "label_fill", "max_boxes", "overflow")
    draws_random = False

    def __init__(self, max_boxes: int, *, boxes: BoxFields | None = None, fill: float = 0.0,
                 label_fill: int = -1, count_key: str = "num_boxes",
                 overflow: Literal["error", "truncate"] = "error") -> None:
        if isinstance(max_boxes, bool) or not isinstance(max_boxes, int) or max_boxes < 1:
            raise ValueError(f"max_boxes must be a positive int, got {max_boxes!r}")
        if overflow not in ("error", "truncate"):
            raise ValueError(f"overflow must be 'error' or 'truncate', got {overflow!r}")
        self.max_boxes = max_boxes
        self.boxes = boxes or BoxFields()
        self.fill = float(fill)
        self.label_fill = int(label_fill)
        self.count_key = count_key
        self.overflow = overflow

    def __call__(self, sample: Sample, rng: np.random.Generator, /) -> Sample:
        out = dict(sample)
        rows = None  # boxes in the sample
        for key in self.boxes.keys:
            if key not in sample:
                continue
            given = np.asarray(sample[key], dtype=np.float32).reshape(-1, 4)
            rows = len(given) if rows is None else rows
            out[key] = self._pad(given, self._count(rows, key), self.fill)
        if rows is None:  # no boxes at all: an image without objects
            rows = 0
            out[self.boxes.keys[0]] = np.full((self.max_boxes, 4), self.fill, np.float32)
        count = min(rows, self.max_boxes)
        for field in self.boxes.fields:
            if field in sample:
                values = np.asarray(sample[field])
                if values.ndim == 0 or len(values) != rows:
                    raise SchemaError(f"'{field}' has {values.shape[0] if values.ndim else 0} "
                                      f"rows for {rows} boxes: a per-box field has one a box")
                fill = self.label_fill if values.dtype.kind in "iub" else self.fill
                out[field] = self._pad(values, count, fill)
        out[self.count_key] = np.int64(count)
        return out

    def _count(self, rows: int, key: str) -> int:
        if rows > self.max_boxes and self.overflow == "error":
            raise SchemaError(
                f"'{key}' holds {rows} boxes, more than PadBoxes(max_boxes={self.max_boxes}): "
                f"raise max_boxes to the most boxes a record has, or pass overflow='truncate' "
                f"to keep the first {self.max_boxes}")
        return min(rows, self.max_boxes)

    def _pad(self, values: np.ndarray, count: int, fill: float) -> np.ndarray:
        padded = np.full((self.max_boxes, *values.shape[1:]), fill, dtype=values.dtype)
        padded[:count] = values[:count]
        return padded

    def __repr__(self) -> str:
        return f"PadBoxes({self.max_boxes}, overflow={self.overflow!r})"


def unpad(batch: Mapping[str, Any], row: int, *, boxes: BoxFields | None = None,
          count_key: str = "num_boxes") -> dict[str, Any]:
    """The boxes and per-box fields of sample ``row`` of a padded batch, without padding."""
    fields = boxes or BoxFields()
    count = int(np.asarray(batch[count_key])[row])
    return {key: batch[key][row][:count] for key in (*fields.keys, *fields.fields)
            if key in batch}
