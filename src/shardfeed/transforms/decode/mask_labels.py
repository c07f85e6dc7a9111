"""Mask label maps: how a decoded mask's pixels become class ids.

:class:`MaskPixels` is a decoded mask (grey values, palette indices with their palette, or
colours: see :func:`shardfeed.transforms.decode.masks.read_mask`); :class:`MaskLabels` gives its
pixels ids, as the table of :mod:`shardfeed.transforms.decode.masks` says: grey values and palette
indices as they are, colours through ``colors`` (looked up a chunk of rows at a time, so the
lookup's temporaries stay a few MB whatever the mask's size).

Determinism: a pure function of the pixels. State: none. Memory: the ids (H×W), and a chunk's
temporaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import cv2
import numpy as np

from shardfeed.errors import DecodeError
from shardfeed.transforms.decode.image import Where, where_text

MaskDtype = Literal["uint8", "uint16"]
MASK_DTYPES: tuple[str, ...] = ("uint8", "uint16")
Color = tuple[int, int, int]

_LIST_COLORS = 6  # colours named in an error message
# Colours are looked up this many pixels at a time: the lookup's temporaries (packed colours,
# positions, matches: 17 bytes a pixel) stay a few MB whatever the mask's size.
_CHUNK_PIXELS = 1 << 18


@dataclass(frozen=True, slots=True)
class MaskPixels:
    """A decoded mask before its pixels are given ids.

    ``kind="grey"``: ``plane`` is H×W grey values (uint8 or uint16); ``"palette"``: H×W
    palette indices and ``palette`` the n×3 RGB colours of the indices; ``"colour"``: H×W×3
    RGB (uint8, or uint16 for 16-bit files). ``source`` is the format (``"png"``, ``"jpeg"``,
    ``"other"``), for messages.
    """

    plane: np.ndarray
    kind: Literal["grey", "palette", "colour"]
    palette: np.ndarray | None = None
    source: str = "png"

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` of the mask."""
        return int(self.plane.shape[0]), int(self.plane.shape[1])

    def grey_values(self) -> np.ndarray | None:
        """A colour mask's values when R = G = B at every pixel (a grey mask stored in three
        channels), else None."""
        rgb = self.plane
        first = rgb[:, :, 0]
        if np.array_equal(first, rgb[:, :, 1]) and np.array_equal(first, rgb[:, :, 2]):
            return np.ascontiguousarray(first)
        return None


def _pack(rgb: np.ndarray) -> np.ndarray:
    """RGB uint8 colours (H×W×3, or n×3) as one uint32 each: ``r | g << 8 | b << 16 | 255 << 24``.

    OpenCV adds the alpha byte and the four bytes are read as one little-endian number: 20×
    faster than shifting and or-ing three widened channels.
    """
    flat = rgb.ndim == 2
    if rgb.size == 0:
        return np.zeros(rgb.shape[:-1], dtype="<u4")
    image = np.ascontiguousarray(rgb[None] if flat else rgb)
    rgba = cv2.cvtColor(image, cv2.COLOR_RGB2RGBA)
    packed = rgba.view("<u4")[:, :, 0]
    return np.asarray(packed[0] if flat else packed)


def _prefix(where: Where) -> str:
    text = where_text(where)
    return f"{text}: " if text else ""


def _color_text(packed: int) -> str:
    return f"({packed & 255}, {(packed >> 8) & 255}, {(packed >> 16) & 255})"


def _check_id(value: Any, dtype: str, what: str) -> int:
    top = int(np.iinfo(np.dtype(dtype)).max)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= top:
        raise ValueError(
            f"{what} must be a class id in 0..{top} (mask_dtype={dtype!r}), got {value!r}"
            + ("; pass mask_dtype='uint16' for ids up to 65535" if dtype == "uint8" else "")
        )
    return int(value)


def _check_color(key: Any) -> Color:
    parts = tuple(key) if isinstance(key, (tuple, list)) else ()
    if len(parts) != 3 or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= 255
        for v in parts
    ):
        raise ValueError(
            f"mask_colors keys are (r, g, b) colours with values 0..255, got {key!r}; "
            "e.g. mask_colors={(0, 0, 0): 0, (128, 0, 0): 1}"
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


@dataclass(kw_only=True, frozen=True, slots=True)
class MaskLabels:
    """How a decoded mask's pixels become class ids (see the module docstring).

    ``colors``: colour (r, g, b) → class id, for colour masks (and palette masks by their
    palette colours); None: colour masks are an error. ``unlisted``: the id of a pixel whose
    colour is not in ``colors``; None: such a pixel is an error. ``dtype``: ``"uint8"``
    (16-bit masks are an error, never cut to 8 bits) or ``"uint16"`` (every mask widened).
    Bad values raise ValueError here, at construction.
    """

    colors: Mapping[Color, int] | None = None
    unlisted: int | None = None
    dtype: MaskDtype = "uint8"
    _keys: np.ndarray = field(init=False, repr=False, compare=False, hash=False)
    _ids: np.ndarray = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.dtype not in MASK_DTYPES:
            raise ValueError(f"mask_dtype must be one of {MASK_DTYPES}, got {self.dtype!r}")
        if self.colors is not None and not isinstance(self.colors, Mapping):
            raise TypeError(
                "mask_colors must be a dict of (r, g, b) colour → class id, got "
                f"{type(self.colors).__name__}; e.g. mask_colors={{(128, 0, 0): 1}}"
            )
        if self.unlisted is not None:
            if self.colors is None:
                raise ValueError(
                    f"mask_unlisted={self.unlisted!r} needs mask_colors: it is the id of pixels "
                    "whose colour mask_colors does not list"
                )
            _check_id(self.unlisted, self.dtype, "mask_unlisted")
        table = {
            _check_color(k): _check_id(v, self.dtype, f"mask_colors[{k!r}]")
            for k, v in (self.colors or {}).items()
        }
        if self.colors is not None:
            # A frozen copy: a dict the caller changes later must not change this op.
            object.__setattr__(self, "colors", dict(sorted(table.items())))
        keys = _pack(np.array(list(table), dtype=np.uint8).reshape(-1, 3))
        ids = np.array(list(table.values()), dtype=self.dtype)
        order = np.argsort(keys, kind="stable")  # searchsorted needs the keys sorted
        object.__setattr__(self, "_keys", keys[order])
        object.__setattr__(self, "_ids", ids[order])

    def labels(self, pixels: MaskPixels, *, where: Where = "") -> np.ndarray:
        """The H×W class ids of ``pixels`` (``dtype``); DecodeError when they have none."""
        target = np.dtype(self.dtype)
        grey = pixels.plane if pixels.kind == "grey" else None
        if pixels.kind == "colour" and self.colors is None:
            grey = pixels.grey_values()
            if grey is None:
                raise DecodeError(self._unmapped_message(pixels, where))
        if grey is not None:
            plane = grey
            if plane.dtype.itemsize > target.itemsize:
                raise DecodeError(
                    f"{_prefix(where)}the mask has {plane.dtype} values (up to "
                    f"{int(plane.max(initial=0))}) and masks decode to uint8: pass "
                    "mask_dtype='uint16' to keep them, or store 8-bit masks"
                )
            return plane if plane.dtype == target else plane.astype(target)
        if pixels.kind == "palette":
            if self.colors is None:
                plane = pixels.plane
                return plane if plane.dtype == target else plane.astype(target)
            return self._palette_ids(pixels, where).astype(target, copy=False)
        if pixels.plane.dtype != np.uint8:
            raise DecodeError(
                f"{_prefix(where)}the mask is a 16-bit colour image; mask_colors maps "
                "8-bit colours: store the masks as 8-bit RGB, palette or grey PNGs"
            )
        try:
            return self._colour_ids(pixels.plane, where).astype(target, copy=False)
        except MemoryError:
            height, width = pixels.size
            raise DecodeError(f"{_prefix(where)}out of memory while giving the {height}×{width} "
                              "colour mask its ids; lower num_threads or max_pixels") from None

    def _colour_ids(self, rgb: np.ndarray, where: Where) -> np.ndarray:
        """The ids of an H×W×3 colour mask, looked up :data:`_CHUNK_PIXELS` at a time."""
        height, width = int(rgb.shape[0]), int(rgb.shape[1])
        ids = np.empty((height, width), dtype=self._ids.dtype)
        rows = max(1, _CHUNK_PIXELS // max(1, width))
        missing: list[np.ndarray] = []
        missing_pixels = 0
        for top in range(0, height, rows):
            packed = _pack(rgb[top:top + rows])
            found, chunk = self._find(packed)
            if not bool(found.all()):
                if self.unlisted is None:
                    missing.append(np.unique(packed[~found]))
                    missing_pixels += int(np.count_nonzero(~found))
                else:
                    chunk[~found] = self.unlisted
            ids[top:top + rows] = chunk
        if missing:
            raise DecodeError(self._missing_message(np.unique(np.concatenate(missing)),
                                                    missing_pixels, where))
        return ids

    def _palette_ids(self, pixels: MaskPixels, where: Where) -> np.ndarray:
        palette = pixels.palette if pixels.palette is not None else np.zeros((0, 3), np.uint8)
        indices = pixels.plane
        # Indices are uint8 (a palette PNG has at most 8 bits a pixel): OpenCV counts them.
        counts = cv2.calcHist([indices], [0], None, [256], [0, 256]).reshape(-1).astype(np.int64)
        used = np.flatnonzero(counts)
        beyond = used[used >= palette.shape[0]]
        if beyond.size:
            raise DecodeError(
                f"{_prefix(where)}the palette mask uses index {int(beyond[0])} but its "
                f"palette has {palette.shape[0]} colours, so mask_colors cannot name it; "
                "re-save the mask with a full palette"
            )
        lut = self._lookup(_pack(palette[used]), where, counts[used])
        table = np.zeros(256, dtype=lut.dtype)
        table[used] = lut
        return np.asarray(cv2.LUT(indices, table))  # one pass, no index array

    def _find(self, packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each packed colour is listed, and its id (0 where it is not)."""
        keys = self._keys
        if keys.size == 0:
            return (np.zeros(packed.shape, dtype=bool),
                    np.zeros(packed.shape, dtype=self._ids.dtype))
        pos = np.searchsorted(keys, packed)
        np.minimum(pos, keys.size - 1, out=pos)
        return keys[pos] == packed, self._ids[pos]

    def _lookup(self, packed: np.ndarray, where: Where, pixels: np.ndarray) -> np.ndarray:
        """The id of each packed colour; ``pixels``: how many pixels each stands for."""
        found, ids = self._find(packed)
        if not bool(found.all()):
            if self.unlisted is None:
                raise DecodeError(self._missing_message(
                    np.unique(packed[~found]), int(pixels[~found].sum()), where))
            ids[~found] = self.unlisted
        return ids

    @staticmethod
    def _missing_message(missing: np.ndarray, count: int, where: Where) -> str:
        listed = ", ".join(_color_text(int(c)) for c in missing[:_LIST_COLORS])
        more = f" and {missing.size - _LIST_COLORS} more" if missing.size > _LIST_COLORS else ""
        return (
            f"{_prefix(where)}the mask has {count} pixels of colours that mask_colors does "
            f"not list: {listed}{more}. Add them to mask_colors, or pass mask_unlisted=ID "
            "(e.g. 255, an ignore id) for them"
        )

    def _unmapped_message(self, pixels: MaskPixels, where: Where) -> str:
        colours = np.unique(_pack(pixels.plane[::4, ::4]).reshape(-1)) if (
            pixels.plane.dtype == np.uint8) else np.zeros(0, np.uint32)
        listed = ", ".join(_color_text(int(c)) for c in colours[:_LIST_COLORS])
        example = (
            f"{{{_color_text(int(colours[0]))}: 0, {_color_text(int(colours[1]))}: 1, ...}}"
            if colours.size >= 2 else "{(128, 0, 0): 1, ...}"
        )
        jpeg = (" A JPEG changes colours; store masks as PNG." if pixels.source == "jpeg" else "")
        return (
            f"{_prefix(where)}the mask is a colour (RGB) image"
            + (f" with colours such as {listed}" if listed else "")
            + "; a mask is a label map (one class id a pixel), and shardfeed does not guess "
            f"ids from colours. Pass mask_colors={example} to the decode op or preset, or "
            f"store the masks as palette or grey PNGs.{jpeg}"
        )


#: The default: grey values and palette indices as uint8; colour and 16-bit masks are errors.
LABEL_MAPS = MaskLabels()


__all__ = ["LABEL_MAPS", "MASK_DTYPES", "Color", "MaskDtype", "MaskLabels", "MaskPixels"]
