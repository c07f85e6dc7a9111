"""A slice's JPEG crops made in one compiled call that holds no GIL.

For the rows of :func:`~shardfeed.transforms.decode.crop_rows.crop_rows_into` whose crop is
resized linearly at full scale (the box under 2× the output one way or both: no DCT scale,
no area resize), the compiled part (``_jpeg_rows.c``) decodes each box with libjpeg (only
its iMCU columns and the rows down to its last where chroma is replicated, the train
preset's default; every column and the rows above it read and dropped with libjpeg's smooth
upsampling), resizes it with OpenCV's 8-bit linear arithmetic and flips it straight into its
batch row, all the slice's rows in one call without the GIL. The bytes are those of the
Python path (the whole image decoded by simplejpeg, or its region by nvImageCodec, then
``cv2.resize`` and ``cv2.flip``): ``tests/transforms/test_native_rows.py`` compares them.

A row the call does not take (a libjpeg error or warning, a JPEG without its end-of-image
marker, a frame of another size than its header said, another colour space than RGB out)
is left to the Python path, which gives the same bytes or the error that names the record.
The call reads a JPEG as far as the Python path would: to its end (so that damage below the
crop fails the row, as a whole decode fails), except for the rows that path decodes as
regions (:func:`~shardfeed.transforms.decode.crop_rows.plain_region_rows`: large images,
where nvImageCodec is installed), which stop at the crop's last row as a region decode does.
Only for RGB uint8 rows in C order with ``exif_orientation="ignore"``; else nothing is done
here. Where the package was built without libjpeg's headers the call is absent and every row
goes the Python path.

Determinism: pure. State: none. Memory: one box's decoded rows and two resized rows, freed
by the call.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from shardfeed.format.native import compiled_module

compiled = compiled_module("shardfeed.transforms.decode._jpeg_rows")
"""The compiled call (``_jpeg_rows.c``); None where built without a C compiler or libjpeg,
or where its pixels are not the Python path's (:func:`agrees`)."""

_checked: list[bool] = []  # the one check of this process, once made
_lock = threading.Lock()


def agrees() -> bool:
    """Whether the compiled call gives the Python path's bytes here, checked once a process
    on a small JPEG (4:2:0, both upsampling modes, a whole image and a region, flipped and
    not): the libjpeg it was built with is the machine's, the Python path's decoders bring
    their own. Where it does not, the call is not used (and a warning says so)."""
    with _lock:
        if not _checked:
            try:
                _checked.append(_self_check())
            except Exception:
                logging.getLogger(__name__).warning(
                    "the check of the compiled JPEG crop call failed: crops are made by the "
                    "Python path", exc_info=True)
                _checked.append(False)
                return False
            if not _checked[0]:
                logging.getLogger(__name__).warning(
                    "the compiled JPEG crop call gives other pixels than simplejpeg and "
                    "OpenCV here (another libjpeg): crops are made by the Python path")
        return _checked[0]


def _self_check() -> bool:
    import cv2
    import simplejpeg

    y, x = np.mgrid[0:48, 0:64]
    pixels = np.dstack([x * 4, y * 5, (x + y) * 3]).astype(np.uint8)
    data = bytes(simplejpeg.encode_jpeg(pixels, quality=85, colorsubsampling="420"))
    out_h, out_w = 32, 40  # each box under 2x of it one way or both: a linear resize
    for fast_upsample in (True, False):
        whole = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True,
                                       fastupsample=fast_upsample)
        rows = [(48, 64, 0, 0, 48, 64, 0, 1), (48, 64, 9, 13, 30, 37, 1, 1),
                (48, 64, 17, 21, 25, 40, 0, 0)]
        out = np.zeros((len(rows), out_h, out_w, 3), np.uint8)
        table = np.array([(k, *row) for k, row in enumerate(rows)], dtype=np.int64)
        assert compiled is not None
        try:
            flags = compiled.crop_rows([data] * len(rows), table, out, out_h, out_w, True,
                                       fast_upsample)
        except Exception:  # noqa: BLE001 - a call that fails here is not used
            return False
        for k, (_, _, top, left, h, w, flip, _) in enumerate(rows):
            expected = cv2.resize(whole[top:top + h, left:left + w], (out_w, out_h),
                                  interpolation=cv2.INTER_LINEAR)
            if flip:
                expected = cv2.flip(expected, 1)
            if not flags[k] or out[k].tobytes() != expected.tobytes():
                return False
    return True


def native_rows_into(values: list[bytes], drawn: list[tuple[int, ...] | None],
                     image_out: np.ndarray, regions: list[int], *, size: tuple[int, int],
                     fast_dct: bool, fast_upsample: bool) -> int:
    """The rows of ``drawn`` (``(height, width, y, x, h, w, flip)`` a JPEG row, None for
    others) that the compiled call decoded, resized to ``size`` and flipped into
    ``image_out`` (RGB uint8 rows, in C order), as a bit mask; 0 where it does not apply
    (see the module doc). ``regions``: the rows the Python path decodes as regions
    (:func:`~.crop_rows.plain_region_rows`); every other row is read to its end, as the
    Python path's whole decode reads it. The caller takes only ops that turn nothing
    (``exif_orientation="ignore"``) and give RGB."""
    if (compiled is None or image_out.dtype != np.uint8 or not image_out.flags.c_contiguous
            or image_out.ndim != 4 or not agrees()):
        return 0
    rows = [row for row, known in enumerate(drawn) if known is not None]
    if not rows:
        return 0
    table = np.ones((len(rows), 9), dtype=np.int64)
    table[:, 0] = rows
    table[:, 1:8] = np.array([drawn[row] for row in rows], dtype=np.int64)
    if regions:
        table[np.isin(table[:, 0], regions), 8] = 0
    out_h, out_w = size
    flags: Any = compiled.crop_rows(values, table, image_out, out_h, out_w, fast_dct,
                                    fast_upsample)
    done = 0
    for row, flag in zip(rows, flags):
        if flag:
            done |= 1 << row
    return done


__all__ = ["compiled", "native_rows_into"]
