"""Region decode of a JPEG: only the rows and columns of a crop, where that costs less.

The optional CPU backend of nvImageCodec (``pip install "shardfeed[nvimgcodec]"``: NVIDIA's
``nvidia-nvimgcodec-cu12`` wheel; ``shardfeed[nvimgcodec-cu12]`` or ``[nvimgcodec-cu13]`` add
the nvJPEG wheel of that CUDA for the GPU decoder; NVIDIA's licence, so never a core
dependency) bundles libjpeg-turbo 3 and decodes a region of interest: rows below the crop are
never read, rows above it are entropy-decoded only (``jpeg_skip_scanlines``), and only the
crop's columns go through the IDCT, upsampling and colour conversion (``jpeg_crop_scanline``).
With the IDCT the crop ops use (``fast_dct``: libjpeg's fast one, ``:fast_idct=1``) and their
upsampling (``fast_upsample``: ``:fancy_upsampling=0``), its pixels are exactly those of the
whole image decoded by simplejpeg with the same options and sliced
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

import ctypes
import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
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


NVJPEG_FOLDERS = {12: ("nvidia/nvjpeg/lib", "nvidia/cu12/lib"), 13: ("nvidia/cu13/lib",)}
"""Where NVIDIA's nvJPEG wheels put ``libnvjpeg.so.<major>``, under a site-packages folder, by
CUDA major: ``nvidia-nvjpeg-cu12`` in ``nvidia/nvjpeg/lib``, ``nvidia-nvjpeg`` 13.x in
``nvidia/cu13/lib``."""
_NVJPEG_MISSING = "Failed to load nvjpeg library"
"""What nvImageCodec's import reports when its nvJPEG extension (every GPU JPEG decoder)
finds no libnvjpeg."""


@dataclass(frozen=True, slots=True)
class Libraries:
    """What loading nvImageCodec found: the CUDA major its wheel is built for (None where no
    wheel's metadata says), the libnvjpeg loaded ahead of its import from a wheel's folder
    (None where none was, or where the system's own was found), and whether its nvJPEG
    extension loaded a libnvjpeg (the GPU decoders exist only then)."""

    cuda_major: int | None
    nvjpeg_path: str | None
    nvjpeg_loaded: bool


_libraries: list[Libraries] = []


def backend() -> ModuleType | None:
    """The nvImageCodec module, or None where it is not installed or fails to load.

    Its import reports, on the process's standard error, every GPU codec library it cannot
    find (none is needed on the CPU): the report is read, not shown, once, while it imports
    (whether nvJPEG was among them: :func:`libraries`). Before the import, the libnvjpeg of
    the nvJPEG wheel that matches the installed nvImageCodec wheel is loaded from its folder
    under any ``sys.path`` entry where the system does not find one: nvImageCodec loads it
    once, at import, only by name and only from beside its own folder, so a wheel installed
    elsewhere (another site-packages, ``pip install --target``) needs no ``LD_LIBRARY_PATH``."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            major = _wheel_cuda_major()
            path = _preload_nvjpeg(major) if major is not None else None
            module, report = _import_quietly()
            _libraries.append(Libraries(cuda_major=major, nvjpeg_path=path,
                                        nvjpeg_loaded=_NVJPEG_MISSING not in report))
            _loaded.append(module)
    return _loaded[0]


def libraries() -> Libraries | None:
    """What loading nvImageCodec found (see :class:`Libraries`); None where it is not
    installed or fails to load."""
    return _libraries[0] if backend() is not None else None


def _wheel_cuda_major() -> int | None:
    """The CUDA major of the installed ``nvidia-nvimgcodec-cu<major>`` wheel (13 before 12
    where both are), from its metadata: the module itself is not imported yet."""
    for major in (13, 12):
        try:
            metadata.version(f"nvidia-nvimgcodec-cu{major}")
        except metadata.PackageNotFoundError:
            continue
        return major
    return None


def _preload_nvjpeg(major: int) -> str | None:
    """Load ``libnvjpeg.so.<major>`` (process-wide) from the first wheel folder that holds it
    (``NVJPEG_FOLDERS`` under each ``sys.path`` entry), unless the system finds one by name
    (``LD_LIBRARY_PATH``, the loader's cache); its path, or None where none was loaded."""
    name = f"libnvjpeg.so.{major}"
    if _loads(name):
        return None
    for entry in sys.path:
        for folder in NVJPEG_FOLDERS.get(major, ()):
            candidate = os.path.join(entry or os.curdir, folder, name)
            if os.path.isfile(candidate) and _loads(candidate):
                return candidate
    return None


def _loads(name: str) -> bool:
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return False
    return True


def _import_quietly() -> tuple[ModuleType | None, str]:
    """The module (None where it does not import) and what its import wrote on the standard
    error (kept from the terminal)."""
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as report:
            os.dup2(report.fileno(), 2)
            try:
                module: ModuleType | None = importlib.import_module("nvidia.nvimgcodec")
            except Exception:  # noqa: BLE001 - not installed, or a wheel that does not load
                module = None
            finally:
                os.dup2(saved, 2)
            report.seek(0)
            text = report.read(1 << 16).decode("utf-8", "replace")
    finally:
        os.close(saved)
    return module, text


def install_hint(torch_cuda: str | None) -> str:
    """The pip line that installs nvImageCodec with the GPU decoder for a torch built with
    CUDA ``torch_cuda`` (``torch.version.cuda``: ``"12.8"``, ``"13.0"``; None for a CPU
    torch or none): the matching wheels, or both lines where the CUDA is not 12 or 13."""
    lines = {12: "pip install 'shardfeed[nvimgcodec-cu12]' (nvidia-nvimgcodec-cu12 and "
                 "nvidia-nvjpeg-cu12, for CUDA 12)",
             13: "pip install 'shardfeed[nvimgcodec-cu13]' (nvidia-nvimgcodec-cu13 and "
                 "nvidia-nvjpeg 13.x, for CUDA 13)"}
    major = _major(torch_cuda)
    if major in lines:
        return f"{lines[major]}, matching torch's CUDA {torch_cuda}"
    said = ("torch has no CUDA" if torch_cuda is None
            else f"torch's CUDA {torch_cuda} is neither 12 nor 13")
    return f"{lines[12]}, or {lines[13]}; {said}"


def nvjpeg_hint(found: Libraries, torch_cuda: str | None) -> str:
    """What to do when nvImageCodec's nvJPEG extension found no libnvjpeg (``found``): the
    nvJPEG wheel of nvImageCodec's CUDA, or the folder to name in ``LD_LIBRARY_PATH``, or,
    where nvImageCodec's CUDA is not torch's, the matching pair."""
    major = found.cuda_major
    torch_major = _major(torch_cuda)
    if major is None:
        return install_hint(torch_cuda)
    if torch_major is not None and torch_major != major:
        return (f"nvImageCodec is built for CUDA {major} and torch for CUDA {torch_cuda}: "
                f"pip uninstall nvidia-nvimgcodec-cu{major}, then {install_hint(torch_cuda)}")
    wheel = "nvidia-nvjpeg-cu12" if major == 12 else f"'nvidia-nvjpeg>={major},<{major + 1}'"
    folder = NVJPEG_FOLDERS.get(major, ("nvidia/cu13/lib",))[0]
    return (f"pip install {wheel} (nvJPEG for CUDA {major}) in the same environment, or, "
            f"where libnvjpeg.so.{major} lies elsewhere, start Python with LD_LIBRARY_PATH "
            f"naming its folder (the wheel's: <site-packages>/{folder})")


def _major(version: str | None) -> int | None:
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() else None


def region_pays(height: int, width: int, box: Box, denominator: int) -> bool:
    """Whether decoding ``box`` alone costs at most ``REGION_GAIN`` of decoding the whole
    image; never where a DCT scale ``1/denominator`` applies (see the module doc)."""
    if denominator > 1 or height * width < REGION_MIN_PIXELS or backend() is None:
        return False
    return bool(region_cost_pays(height, width, min(height, box.y + box.h), box.h, box.w))


def region_cost_pays(height: Any, width: Any, bottom: Any, h: Any, w: Any) -> Any:
    """The cost rule of :func:`region_pays` for a crop ``h``×``w`` whose last row is
    ``bottom`` (exclusive) of a ``height``×``width`` image: on integers, or elementwise on
    int64 arrays of rows (the same operations in the same order: the same answers)."""
    region = ENTROPY_SHARE * bottom * width + (1.0 - ENTROPY_SHARE) * h * w
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
    return decode_regions([data], [box], fast_dct=fast_dct, fast_upsample=fast_upsample)[0]


def decode_regions(datas: Sequence[bytes | memoryview], boxes: Sequence[Box], *,
                   fast_dct: bool, fast_upsample: bool) -> list[np.ndarray | None]:
    """The RGB pixels of each ``box`` of JPEG ``data`` (as :func:`decode_region`), the
    regions decoded in one call of the decoder (one hand-over and one GIL release for them
    all; the pixels are those of one at a time): a list with None for each that it does not
    decode (a JPEG without its end-of-image marker, one it refuses: the caller decodes that
    one as without), all None where the backend is absent or the call fails."""
    out: list[np.ndarray | None] = [None] * len(datas)
    module = backend()
    if module is None:
        return out
    streams, rows = [], []
    code_stream, region = module.CodeStream, module.Region
    for row, (data, box) in enumerate(zip(datas, boxes)):
        encoded = data if type(data) is bytes else bytes(data)
        if not encoded.endswith(b"\xff\xd9"):
            continue
        y, x = box.y, box.x
        try:
            streams.append(code_stream(encoded).get_sub_code_stream(
                region=region(start=(y, x), end=(y + box.h, x + box.w))))
        except Exception:  # noqa: BLE001, S112 - that one is decoded the usual way
            continue
        rows.append(row)
    if not streams:
        return out
    try:
        images = _decoder(module, fast_dct, fast_upsample).decode(streams,
                                                                 params=_params(module))
    except Exception:  # noqa: BLE001 - every one decoded the usual way
        return out
    for row, image in zip(rows, images):
        if image is None:
            continue
        box = boxes[row]
        try:
            pixels = np.asarray(image.cpu())
        except Exception:  # noqa: BLE001, S112 - that one is decoded the usual way
            continue
        if pixels.shape == (box.h, box.w, 3) and pixels.dtype == np.uint8:
            out[row] = pixels
    return out


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


__all__ = ["ENTROPY_SHARE", "NVJPEG_FOLDERS", "Libraries", "backend", "decode_region",
           "decode_regions", "install_hint", "libraries", "no_turn", "nvjpeg_hint",
           "region_cost_pays", "region_pays"]
