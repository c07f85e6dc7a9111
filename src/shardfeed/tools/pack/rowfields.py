"""The types rows are read as: :class:`RowFields` (how rows become records) and :class:`Row`
(one row and where it came from), shared by every input kind of
:mod:`~shardfeed.tools.pack.rows` (Parquet, Hugging Face, tars, ``.npz``, arrays)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shardfeed.format import spec

__all__ = ["Encode", "Row", "RowFields"]

Encode = Literal["png", "jpeg", "raw"]


@dataclass(frozen=True, slots=True)
class RowFields:
    """How rows become records.

    ``image``: the image column. ``labels``: the label columns (None: every column but the
    image and the name). ``label``: the column a loader returns as the label (default: the
    first label column). ``name``: the column stored as ``image/filename`` (None: none).
    ``encode``: how pixel arrays are stored: ``png`` (lossless, 8 or 16 bits), ``jpeg``
    (``quality``), or ``raw`` uint8 pixels. ``root``: the folder image paths in the data
    are read under (None: paths are refused; see the module docstring).
    """

    image: str = "image"
    labels: Sequence[str] | None = None
    label: str | None = None
    name: str | None = None
    encode: Encode = "png"
    quality: int = 95
    root: str | None = None
    """The folder image paths in the data are read under (and only under); None: a path
    where an image is expected is refused."""

    def __post_init__(self) -> None:
        if self.encode not in ("png", "jpeg", "raw"):
            raise ValueError(f"encode must be 'png', 'jpeg' or 'raw', got {self.encode!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")

    def label_columns(self, row: Mapping[str, Any]) -> list[str]:
        if self.labels is not None:  # a row's mask (a tar's x.seg.png) is kept too
            masks = (spec.MASK_ENCODED, spec.MASK_FORMAT)
            return [*self.labels, *(k for k in masks if k in row and k not in self.labels)]
        return [k for k in row if k not in (self.image, self.name) and not k.startswith("__")]


class Row(dict[str, Any]):
    """One row of an input, and where it came from for messages (``'a.parquet', row 7``):
    the input kinds yield these, so that a bad value is named by file and row, not by its
    position in a partition."""

    __slots__ = ("where",)

    def __init__(self, values: Mapping[str, Any], where: str) -> None:
        super().__init__(values)
        self.where = where
