"""Helpers for the transforms tests (a unique module name: tests/ is not a package)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one protobuf message, just enough for Example."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value = buf[pos : pos + size]
            pos += size
        elif wire == 5:
            value = buf[pos : pos + 4]
            pos += 4
        elif wire == 1:
            value = buf[pos : pos + 8]
            pos += 8
        else:  # pragma: no cover - not used by Example
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def parse_example(payload: bytes) -> dict[str, Any]:
    """A minimal tf.train.Example parser (test-only, independent of shardfeed.format)."""
    result: dict[str, Any] = {}
    for _n, _w, features in _fields(payload):
        for _n2, _w2, entry in _fields(features):
            key = value = None
            for num, _w3, part in _fields(entry):
                if num == 1:
                    key = part.decode()
                else:
                    value = part
            assert key is not None and value is not None
            (kind, _w4, lst), = _fields(value)
            items = _fields(lst)
            if kind == 1:
                vals = [v for _, _, v in items]
                result[key] = vals[0] if len(vals) == 1 else vals
            elif kind == 2:
                raw = b"".join(v for _, _, v in items)
                result[key] = np.frombuffer(raw, "<f4").astype(np.float32)
            else:
                ints: list[int] = []
                for _, wire, v in items:
                    if wire == 2:
                        p = 0
                        while p < len(v):
                            x, p = _varint(v, p)
                            ints.append(x - (1 << 64) if x >= 1 << 63 else x)
                    else:
                        ints.append(v - (1 << 64) if v >= 1 << 63 else v)
                result[key] = np.asarray(ints, dtype=np.int64)
    return result


def read_records(path: Path) -> list[tuple[int, bytes]]:
    """(offset, payload) of every record of a TFRecord file, no CRC checks."""
    data = path.read_bytes()
    out = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, data[pos + 12 : pos + 12 + length]))
        pos += 12 + length + 4
    return out


def smooth_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A smooth RGB test picture (gradients + blobs): JPEG keeps it well, resizes behave."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        fy, fx = rng.uniform(1, 4, size=2)
        img[..., c] = 128 + 100 * np.sin(yy / height * fy * np.pi + c) * np.cos(
            xx / width * fx * np.pi
        )
    return np.clip(img, 0, 255).astype(np.uint8)


def jpeg_bytes(image: np.ndarray, quality: int = 92) -> bytes:
    return bytes(simplejpeg.encode_jpeg(np.ascontiguousarray(image), quality=quality))
