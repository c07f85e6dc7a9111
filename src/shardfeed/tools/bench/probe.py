"""Measuring helpers of ``bench``: resident memory, bytes read, and the decode limit.

- :class:`RssSampler` samples the process's resident set size on a background thread, so a
  peak between two batches is seen (``ru_maxrss`` would also count everything before).
- :func:`bytes_read` is the process's ``rchar`` counter (every byte returned by read and pread
  calls, from the page cache or the disk), where the platform has one.
- :func:`decode_limit` decodes the same encoded images fully on ``num_threads`` threads: the
  rate no decode-bound pipeline over these files can beat without reduced-scale decoding.

Determinism: which records the decode limit uses is keyed by the seed. State: none kept
between calls. Memory: the decode limit holds the encoded bytes of at most ``max_bytes``.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DecodeLimit", "RssSampler", "bytes_read", "current_rss_bytes", "decode_limit"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int | None:
    """Resident set size of this process now (Linux ``/proc``), or None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since it started (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if os.uname().sysname == "Darwin" else 1024)


def bytes_read() -> int | None:
    """Bytes this process has read so far (``rchar`` of ``/proc/self/io``), or None."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Samples the resident set size every ``interval_seconds`` until stopped; keeps the peak.

    Use as a context manager around the code to measure. ``peak_bytes`` is None where the
    platform does not expose the current RSS.
    """

    def __init__(self, *, interval_seconds: float = 0.02) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds!r}")
        self.interval_seconds = interval_seconds
        self.start_bytes = current_rss_bytes()
        self.peak_bytes = self.start_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shardfeed-rss", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self.sample()

    def sample(self) -> None:
        now = current_rss_bytes()
        if now is not None and (self.peak_bytes is None or now > self.peak_bytes):
            self.peak_bytes = now

    def __enter__(self) -> RssSampler:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass(frozen=True, slots=True)
class DecodeLimit:
    """Full decodes of the same images on ``threads`` threads: images/s and megapixels/s."""

    images_per_s: float
    mpix_per_s: float
    images: int
    distinct_images: int
    threads: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "images_per_s": self.images_per_s, "mpix_per_s": self.mpix_per_s,
            "images": self.images, "distinct_images": self.distinct_images,
            "threads": self.threads, "seconds": self.seconds,
        }


def sample_encoded(
    dataset: Any, *, image_key: str, seed: int, max_images: int = 2048, max_bytes: int = 256 << 20
) -> list[bytes]:
    """Encoded image bytes of up to ``max_images`` records (a keyed random subset), at most
    ``max_bytes`` in all; always at least one record."""
    n = len(dataset)
    rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([seed, 0xBE4C])))
    picks = np.sort(rng.permutation(n)[: min(n, max_images)])
    out: list[bytes] = []
    total = 0
    for start in range(0, len(picks), 256):
        for record in dataset.read_many(picks[start : start + 256].tolist()):
            value = record.get(image_key)
            if isinstance(value, list):
                value = value[0] if value else None
            if not isinstance(value, (bytes, bytearray, memoryview)):
                continue
            out.append(bytes(value))
            total += len(value)
            if total >= max_bytes:
                return out
    return out


def decode_limit(
    encoded: Sequence[bytes], *, num_threads: int, seconds: float, min_images: int = 8,
    max_pixels: int | None = None,
) -> DecodeLimit:
    """Decode ``encoded`` round and round on ``num_threads`` threads for about ``seconds``
    (and at least ``min_images`` decodes); the decode is
    :func:`shardfeed.transforms.decode.image.decode_image` (full size, RGB; images up to
    ``max_pixels``, default the decode's)."""
    from functools import partial

    from shardfeed.transforms.decode.image import DEFAULT_MAX_PIXELS
    from shardfeed.transforms.decode.image import decode_image as decode

    decode_image = partial(decode, max_pixels=max_pixels or DEFAULT_MAX_PIXELS)

    if not encoded:
        raise ValueError("decode_limit needs at least one encoded image")
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    lock = threading.Lock()
    counters = {"next": 0, "images": 0, "pixels": 0}
    deadline = [0.0]

    def work() -> None:
        while True:
            with lock:
                if counters["images"] >= min_images and time.perf_counter() >= deadline[0]:
                    return
                i = counters["next"]
                counters["next"] = i + 1
            image = decode_image(encoded[i % len(encoded)])
            with lock:
                counters["images"] += 1
                counters["pixels"] += image.shape[0] * image.shape[1]

    decode_image(encoded[0])  # load the library and warm the allocator before timing
    with ThreadPoolExecutor(max_workers=num_threads) as pool:
        start = time.perf_counter()
        deadline[0] = start + seconds
        for future in [pool.submit(work) for _ in range(num_threads)]:
            future.result()
        elapsed = time.perf_counter() - start
    return DecodeLimit(
        images_per_s=counters["images"] / elapsed,
        mpix_per_s=counters["pixels"] / elapsed / 1e6,
        images=counters["images"],
        distinct_images=len(encoded),
        threads=num_threads,
        seconds=elapsed,
    )
