"""Decode throughput: JPEG bindings, and shardfeed's crop-aware decode, in images/s.

Builds N deterministic ~500×375 quality-90 JPEGs from scikit-image's bundled photographs
(plus a set of 1566×1566 ones for reduced-scale decode) and prints one CSV row per
configuration: median images/s of 3 repeats and the ratio to simplejpeg's full decode on 1
thread, measured in the same run.

Optional bindings are measured when importable: ``imagecodecs`` and ``PyTurboJPEG``. With
``--turbojpeg-lib PATH`` (a libturbojpeg >= 3 shared library) PyTurboJPEG uses it and a small
ctypes binding measures TurboJPEG 3's partial (cropped) decode, which no Python package on
PyPI exposes.

    python bench/bench_decode.py [--images 64] [--repeats 3] [--turbojpeg-lib PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import io
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import simplejpeg

from shardfeed.transforms import DecodeCenterCrop, DecodeRandomResizedCrop
from shardfeed.transforms.boxes import random_resized_box, scale_denominator


def make_jpegs(count: int, height: int, width: int, *, quality: int = 90) -> list[bytes]:
    """``count`` deterministic JPEGs cut and resized from scikit-image's colour photos."""
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.hubble_deep_field()]
    rng = np.random.Generator(np.random.Philox(1234))
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        ph, pw = photo.shape[:2]
        ch = int(ph * rng.uniform(0.6, 1.0))
        cw = int(pw * rng.uniform(0.6, 1.0))
        y = int(rng.integers(0, ph - ch + 1))
        x = int(rng.integers(0, pw - cw + 1))
        crop = photo[y : y + ch, x : x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        image = cv2.resize(np.ascontiguousarray(crop), (width, height), interpolation=cv2.INTER_CUBIC)
        out.append(bytes(simplejpeg.encode_jpeg(image, quality=quality, colorsubsampling="420")))
    return out


def measure(work: Callable[[bytes], object], jpegs: Sequence[bytes], *, threads: int, repeats: int) -> float:
    """Median images/s of ``work`` over ``jpegs`` on ``threads`` threads."""
    rates = []
    for _ in range(repeats):
        if threads == 1:
            start = time.perf_counter()
            for item in jpegs:
                work(item)
            elapsed = time.perf_counter() - start
        else:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(work, jpegs[: threads * 2]))  # warm the threads' buffers
                start = time.perf_counter()
                list(pool.map(work, jpegs, chunksize=max(1, len(jpegs) // (threads * 8))))
                elapsed = time.perf_counter() - start
        rates.append(len(jpegs) / elapsed)
    return statistics.median(rates)


class TurboJPEG3Crop:
    """Partial decode through TurboJPEG 3 (``tj3SetScalingFactor`` + ``tj3SetCroppingRegion``)."""

    class _Scaling(ctypes.Structure):
        _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]

    class _Region(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.tj3Init.restype = ctypes.c_void_p
        lib.tj3Init.argtypes = [ctypes.c_int]
        lib.tj3DecompressHeader.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.tj3Get.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.tj3Set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.tj3SetScalingFactor.argtypes = [ctypes.c_void_p, self._Scaling]
        lib.tj3SetCroppingRegion.argtypes = [ctypes.c_void_p, self._Region]
        lib.tj3Decompress8.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
        ]
        lib.tj3GetErrorStr.restype = ctypes.c_char_p
        lib.tj3GetErrorStr.argtypes = [ctypes.c_void_p]
        self.lib = lib
        import threading

        self.local = threading.local()

    def _handle(self) -> int:
        handle = getattr(self.local, "handle", None)
        if handle is None:
            handle = self.lib.tj3Init(1)  # TJINIT_DECOMPRESS
            self.lib.tj3Set(handle, 10, 1)  # TJPARAM_FASTDCT
            self.local.handle = handle
        return int(handle)

    def decode_crop(self, data: bytes, box: tuple[int, int, int, int], denom: int) -> np.ndarray:
        """Decode the region ``(y, x, h, w)`` (full-size pixels) at scale 1/denom."""
        lib = self.lib
        handle = self._handle()
        lib.tj3DecompressHeader(handle, data, len(data))
        width = lib.tj3Get(handle, 5)
        height = lib.tj3Get(handle, 6)
        subsamp = lib.tj3Get(handle, 4)
        mcu_w = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32}.get(subsamp, 16)
        lib.tj3SetScalingFactor(handle, self._Scaling(1, denom))
        sw, sh = -(-width // denom), -(-height // denom)
        y, x, h, w = (v // denom for v in box)
        step = max(1, mcu_w // denom)
        x0 = (x // step) * step
        w = min(sw - x0, w + (x - x0))
        h = min(sh - y, max(1, h))
        lib.tj3SetCroppingRegion(handle, self._Region(x0, y, w, h))
        out = np.empty((h, w, 3), np.uint8)
        if lib.tj3Decompress8(handle, data, len(data), out.ctypes.data, w * 3, 0) != 0:
            raise RuntimeError(lib.tj3GetErrorStr(handle).decode())
        return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--turbojpeg-lib", default=None)
    args = parser.parse_args(argv)
    cv2.setNumThreads(1)  # one decode per thread; parallelism comes from our threads

    small = make_jpegs(args.images, 375, 500)
    large = make_jpegs(max(8, args.images // 4), 1566, 1566)
    configs: list[tuple[str, Callable[[bytes], object], list[bytes], int]] = []

    def add(name: str, work: Callable[[bytes], object], jpegs: list[bytes], threads: int = 1) -> None:
        configs.append((name, work, jpegs, threads))

    add("simplejpeg full decode", lambda d: simplejpeg.decode_jpeg(d, fastdct=True), small)
    add("simplejpeg full decode", lambda d: simplejpeg.decode_jpeg(d, fastdct=True), small, 2)
    buf = np.empty(500 * 375 * 3, np.uint8)
    add("simplejpeg full decode, reused buffer",
        lambda d: simplejpeg.decode_jpeg(d, fastdct=True, buffer=buf), small)
    add("opencv imdecode", lambda d: cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR), small)
    add("opencv imdecode REDUCED_2",
        lambda d: cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_REDUCED_COLOR_2), small)
    from PIL import Image

    add("PIL open+convert+asarray", lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB")), small)
    try:
        import imagecodecs

        add("imagecodecs jpeg8_decode", lambda d: imagecodecs.jpeg8_decode(d), small)
        add("imagecodecs jpeg8_decode", lambda d: imagecodecs.jpeg8_decode(d), small, 2)
    except ImportError:
        print("# imagecodecs not installed", flush=True)
    if args.turbojpeg_lib:
        try:
            from turbojpeg import TJFLAG_FASTDCT, TJPF_RGB, TurboJPEG

            tj = TurboJPEG(lib_path=args.turbojpeg_lib)
            add("PyTurboJPEG decode",
                lambda d: tj.decode(d, pixel_format=TJPF_RGB, flags=TJFLAG_FASTDCT), small)
        except (ImportError, OSError) as exc:
            print(f"# PyTurboJPEG unavailable: {exc}", flush=True)

    rrc = DecodeRandomResizedCrop(args.size, hflip=0.5)
    rrc_full = DecodeRandomResizedCrop(args.size, hflip=0.5, reduced_decode=False)
    keys = {d: i for i, d in enumerate(small)}
    keys.update({d: i for i, d in enumerate(large)})

    def ours(op: Callable[..., dict[str, object]]) -> Callable[[bytes], object]:
        slots = np.empty((len(keys), args.size, args.size, 3), np.uint8)

        def work(d: bytes) -> object:
            i = keys[d]
            return op({"image/encoded": d}, np.random.Generator(np.random.Philox(i)), out=slots[i])

        return work

    add("shardfeed decode+RRC+resize+flip", ours(rrc), small)
    add("shardfeed decode+RRC+resize+flip", ours(rrc), small, 2)
    add("shardfeed decode+RRC, no reduced scale", ours(rrc_full), small)
    add("shardfeed eval DecodeCenterCrop", ours(DecodeCenterCrop(args.size)), small)
    add("simplejpeg full decode 1566x1566", lambda d: simplejpeg.decode_jpeg(d, fastdct=True), large)
    add("shardfeed decode+RRC 1566x1566", ours(rrc), large)
    add("shardfeed decode+RRC 1566x1566", ours(rrc), large, 2)
    add("shardfeed decode+RRC 1566x1566, no reduced scale", ours(rrc_full), large)
    add("shardfeed eval DecodeCenterCrop 1566x1566", ours(DecodeCenterCrop(args.size)), large)

    if args.turbojpeg_lib:
        crop = TurboJPEG3Crop(args.turbojpeg_lib)

        def region(d: bytes) -> object:
            h, w = (1566, 1566) if len(d) > 200_000 else (375, 500)
            box = random_resized_box(h, w, np.random.Generator(np.random.Philox(keys[d])),
                                     scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
            denom = scale_denominator(box.h, box.w, args.size, args.size)
            part = crop.decode_crop(d, (box.y, box.x, box.h, box.w), denom)
            return cv2.resize(part, (args.size, args.size), interpolation=cv2.INTER_LINEAR)

        add("TurboJPEG3 crop+scaled decode+resize (ctypes)", region, small)
        add("TurboJPEG3 crop+scaled decode+resize (ctypes) 1566x1566", region, large)

    # Round-robin: every repeat runs every configuration once, so load from other processes
    # hits all of them alike and the ratios stay fair.
    rates: list[list[float]] = [[] for _ in configs]
    for _ in range(args.repeats):
        for i, (_name, work, jpegs, threads) in enumerate(configs):
            rates[i].append(measure(work, jpegs, threads=threads, repeats=1))
    print(f"# {len(small)} JPEGs 500x375 q90 4:2:0, {len(large)} JPEGs 1566x1566; median of "
          f"{args.repeats} round-robin repeats; ratio to simplejpeg full decode on 1 thread")
    print("config,threads,images_per_s,ratio")
    base = statistics.median(rates[0])
    for (name, _work, _jpegs, threads), values in zip(configs, rates):
        rate = statistics.median(values)
        print(f"{name},{threads},{rate:.0f},{rate / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
