"""Region decode of a JPEG: only the rows and columns of a crop, where that costs less.

The optional CPU backend of nvImageCodec (``pip install "shardfeed[nvimgcodec]"``: NVIDIA's
``nvidia-nvimgcodec-cu12`` wheel, under NVIDIA's licence, so never a core dependency) bundles
libjpeg-turbo 3 and decodes a region of interest: rows below the crop are never read, rows
above it are entropy-decoded only (``jpeg_skip_scanlines``), and only the crop's columns go
through the IDCT, upsampling and colour conversion (``jpeg_crop_scanline``). With the IDCT the
crop ops use (``fast_dct``: libjpeg's fast one, ``:fast_idct=1``) and their upsampling
(``fast_upsample``: ``:fancy_upsampling=0``), its pixels are exactly those of the whole image
decoded by simplejpeg with the same options and sliced
(``tests/transforms/test_region_decode.py`` compares them on random boxes), so the output
bytes do not depend on whether the backend is installed.

:func:`region_pays` decides per image by cost. A JPEG's decode splits into the entropy decode
of every row down to the last one used (about ``ENTROPY_SHARE`` of a whole decode of these
images: a 1/8-scale decode, nearly all entropy decode, took 0.71 of a full one on 500×375
photos) and the per-pixel work (the rest). The region's cost is the entropy share of its
rows plus the per-pixel share of its pixels, against the whole image's. Where a DCT scale
applies (the crop is shrunk 2× or more) the reduced-scale decode is kept: it is cheaper by
the same model in nearly every case (the entropy share plus ``1/d²`` of the rest), and a
region there would give other bytes (a full-size crop resized, not the scaled decode's), so
the output would depend on whether the backend is installed.

nvImageCodec turns an image as its EXIF Orientation tag says unless told not to; it is told
not to (:func:`no_turn`): the region is a box of the stored pixels, as every other decode
path gives them, and the crop ops turn it themselves where ``exif_orientation="apply"``
asks (:mod:`~shardfeed.transforms.decode.orientation`).

A region is decoded only from a JPEG that ends with its end-of-image marker: a file cut short
below the crop would decode there and fail the whole decode, which names it.

Anything the backend does not take (a damaged file, a CMYK or progressive stream it refuses,
an import that fails) gives None: the caller decodes as without it, which raises the same
DecodeError naming the record.

Determinism: pure (the choice depends on the header and the box only). State: a decoder a
thread and option. Memory: the region's pixels.
"""

from __future__ import annotations

import importlib
import os
import threading
from types import ModuleType
from typing import Any

import numpy as np

from shardfeed.transforms.boxes import Box

ENTROPY_SHARE = 0.7
"""The share of a whole JPEG decode spent decoding entropy (every row down to the last one
used), measured as the cost of a 1/8-scale decode against a full one."""
REGION_MIN_PIXELS = 1 << 16
"""Images smaller than this are decoded whole: the region call's fixed cost (~12 µs of
stream set-up and hand-over) is then a large part of the decode."""
REGION_GAIN = 0.85
"""A region is used when its cost is at most this share of the alternative's."""

_lock = threading.Lock()
_loaded: list[ModuleType | None] = []
_local = threading.local()


def backend() -> ModuleType | None:
    """The nvImageCodec module, or None where it is not installed or fails to load.

    Its import reports, on the process's standard error, every GPU codec library it cannot
    find (none is needed on the CPU): the report is dropped, once, while it imports."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_import_quietly())
    return _loaded[0]


def _import_quietly() -> ModuleType | None:
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            try:
                return importlib.import_module("nvidia.nvimgcodec")
            except Exception:  # noqa: BLE001 - not installed, or a wheel that does not load
                return None
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def region_pays(height: int, width: int, box: Box, denominator: int) -> bool:
    """Whether decoding ``box`` alone costs at most ``REGION_GAIN`` of decoding the whole
    image; never where a DCT scale ``1/denominator`` applies (see the module doc)."""
    if denominator > 1 or height * width < REGION_MIN_PIXELS or backend() is None:
        return False
    rows = min(height, box.y + box.h)
    region = ENTROPY_SHARE * rows * width + (1.0 - ENTROPY_SHARE) * box.h * box.w
    return region <= REGION_GAIN * height * width


def no_turn(module: Any) -> Any:
    """nvImageCodec's decode parameters that keep the stored pixels: the EXIF orientation
    tag not applied (its default applies it), colours in sRGB, 8 bits a sample."""
    return module.DecodeParams(apply_exif_orientation=False)


def decode_region(data: bytes | memoryview, box: Box, *, fast_dct: bool,
                  fast_upsample: bool) -> np.ndarray | None:
    """The RGB pixels of ``box`` (box.h×box.w×3 uint8, in the stored image's pixels: the
    EXIF tag is not applied) of JPEG ``data``, decoded alone; None where the backend is
    absent or does not decode it (the caller then decodes as without)."""
    module = backend()
    if module is None or bytes(data[-2:]) != b"\xff\xd9":
        return None
    try:
        stream = module.CodeStream(bytes(data)).get_sub_code_stream(
            region=module.Region(start=(box.y, box.x), end=(box.y + box.h, box.x + box.w)))
        image = _decoder(module, fast_dct, fast_upsample).decode(stream, params=_params(module))
        if image is None:
            return None
        pixels = np.asarray(image.cpu())
    except Exception:  # noqa: BLE001 - anything it refuses is decoded the usual way
        return None
    if pixels.shape != (box.h, box.w, 3) or pixels.dtype != np.uint8:
        return None
    return pixels


def _params(module: Any) -> Any:
    """This thread's :func:`no_turn` parameters (made once a thread)."""
    params = getattr(_local, "params", None)
    if params is None:
        params = _local.params = no_turn(module)
    return params


def _decoder(module: Any, fast_dct: bool, fast_upsample: bool) -> Any:
    """This thread's CPU-only decoder with libjpeg's fast IDCT or not (``fast_dct``) and its
    fancy upsampling or not (``fast_upsample``), as simplejpeg's options of the same names
    (one thread each: the loader's threads are the parallelism)."""
    decoders: dict[tuple[bool, bool], Any] | None = getattr(_local, "decoders", None)
    if decoders is None:
        decoders = _local.decoders = {}
    decoder = decoders.get((fast_dct, fast_upsample))
    if decoder is None:
        options = f":fast_idct={int(fast_dct)} :fancy_upsampling={int(not fast_upsample)}"
        decoder = decoders[fast_dct, fast_upsample] = module.Decoder(
            device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
            backends=[module.Backend(module.BackendKind.CPU_ONLY)], options=options)
    return decoder


__all__ = ["ENTROPY_SHARE", "backend", "decode_region", "no_turn", "region_pays"]
