"""The scaled warp: a crop box sampled from its image decoded at a DCT scale.

Where a crop shrinks 2× or more (but less than 2× more after the scale), its JPEG is decoded
at scale ``1/d`` and the box, whose edges need not fall on the scaled image's pixels, is
sampled from that scaled image: output pixel ``(i, j)`` is the bilinear sample at the box's
pixel centre, in scaled pixels ``X = (x + (j + 0.5) w / out_w) / d - 0.5`` (``Y`` alike).
Rounding the box to whole scaled pixels instead would shift the output by up to half a pixel.

The arithmetic is integer and exact, so that every road gives the same bytes: ``X`` is rounded
to 1/2048 of a pixel (ties up) from the box's integers; the neighbours outside the image are
its edge pixels; each output is ``Σ weight × pixel`` in units of 2^-22, rounded half up.
:func:`scaled_warp` runs it compiled (``_jpeg_rows.warp``, uint8 images) or in NumPy (any
integer image: uint16 too, and wherever the package was built without the compiled part);
the compiled slice call (:mod:`~shardfeed.transforms.decode.native_rows`) runs the same code
straight after its decode. ``tests/transforms/test_scaled_warp.py`` holds them to each other.

Determinism: pure. State: none. Memory: the output and, in NumPy, a few int64 arrays of
its size.
"""

from __future__ import annotations

import numpy as np

from shardfeed.format.native import compiled_module
from shardfeed.transforms.boxes import Box

BITS = 11
ONE = 1 << BITS

_compiled = compiled_module("shardfeed.transforms.decode._jpeg_rows")


def warp_axis(start: int, length: int, n: int, d: int, limit: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the ``n`` outputs along one axis of the box ``(start, length)`` at scale ``1/d``
    of a scaled image ``limit`` pixels long: the two source indices of each (clamped to the
    image) and the second one's weight, in 1/2048."""
    j = np.arange(n, dtype=np.int64)
    den = 2 * d * n
    num = ONE * (2 * start * n + (2 * j + 1) * length - d * n)
    q = (2 * num + den) // (2 * den)  # X * 2048 rounded half up (floor division)
    first = q >> BITS
    return (np.clip(first, 0, limit - 1), np.clip(first + 1, 0, limit - 1),
            q - (first << BITS))


def scaled_warp(decoded: np.ndarray, box: Box, d: int, size: tuple[int, int], flip: bool,
                out: np.ndarray | None = None) -> np.ndarray:
    """Box ``box`` (of the full-size image) of ``decoded`` (H'×W'×C, the image at scale
    ``1/d``) sampled into ``size`` (out_h, out_w) as the module doc says, mirrored left to
    right where ``flip``; into ``out`` where given (of that shape and ``decoded``'s dtype)."""
    out_h, out_w = size
    c = decoded.shape[2]
    if (_compiled is not None and decoded.dtype == np.uint8 and 1 <= c <= 4
            and decoded.strides[1:] == (c, 1)):
        if out is None or out.dtype != np.uint8 or not out.flags.c_contiguous:
            target = np.empty((out_h, out_w, c), np.uint8)
        else:
            target = out
        _compiled.warp(decoded, target, out_h, out_w, box.y, box.x, box.h, box.w, d, flip)
        if out is not None and target is not out:
            out[...] = target
            return out
        return target
    result = _numpy_warp(decoded, box, d, size, flip)
    if out is not None:
        out[...] = result
        return out
    return result


def _numpy_warp(decoded: np.ndarray, box: Box, d: int, size: tuple[int, int], flip: bool
                ) -> np.ndarray:
    out_h, out_w = size
    sh, sw = decoded.shape[:2]
    ya, yb, fy = warp_axis(box.y, box.h, out_h, d, sh)
    xa, xb, fx = warp_axis(box.x, box.w, out_w, d, sw)
    if flip:
        xa, xb, fx = xa[::-1], xb[::-1], fx[::-1]
    gx, fxc = (ONE - fx)[None, :, None], fx[None, :, None]

    def taken(rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        # the output's neighbours only, widened after the gather (not the whole image)
        near: np.ndarray = decoded[np.ix_(rows, columns)].astype(np.int64)
        return near

    top = taken(ya, xa) * gx + taken(ya, xb) * fxc
    bottom = taken(yb, xa) * gx + taken(yb, xb) * fxc
    total = top * (ONE - fy)[:, None, None] + bottom * fy[:, None, None]
    result: np.ndarray = ((total + (1 << (2 * BITS - 1))) >> (2 * BITS)).astype(decoded.dtype)
    return result


__all__ = ["scaled_warp", "warp_axis"]
