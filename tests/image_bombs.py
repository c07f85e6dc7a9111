"""Decompression bombs for the tests: tiny files whose headers claim huge images.

Each is a real small image with its size fields rewritten (and the PNG's IHDR CRC fixed), so
every parser reads the header as valid and only the claimed size is hostile. Also: a helper
that runs Python code in a fresh process and returns its peak resident memory.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import simplejpeg

import shardfeed

TESTS = Path(__file__).resolve().parent
SRC = str(Path(shardfeed.__file__).resolve().parents[1])  # the shardfeed under test


def jpeg_bomb(height: int, width: int) -> bytes:
    """A 16×16 baseline JPEG whose frame header (SOF0) claims ``height``×``width``."""
    data = bytearray(simplejpeg.encode_jpeg(np.full((16, 16, 3), 90, np.uint8), quality=50))
    sof = data.find(b"\xff\xc0")
    assert sof > 0
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def png_bomb(height: int, width: int, *, grey: bool = False) -> bytes:
    """A 4×4 PNG whose IHDR claims ``height``×``width`` (with a valid CRC)."""
    shape = (4, 4) if grey else (4, 4, 3)
    ok, encoded = cv2.imencode(".png", np.zeros(shape, np.uint8))
    assert ok
    data = bytearray(encoded.tobytes())
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def png_real(height: int, width: int) -> bytes:
    """A genuine grey PNG of ``height``×``width`` black pixels (decodes fully; a few hundred
    kB for a hundred megapixels), written row by row so the test never holds the pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(
            ">I", zlib.crc32(kind + body))

    packer = zlib.compressobj(9)
    row = bytes(width + 1)  # filter byte 0, then the row's samples
    parts = [packer.compress(row * 64) for _ in range(height // 64)]
    parts.append(packer.compress(row * (height % 64)))
    parts.append(packer.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts))
            + chunk(b"IEND", b""))


def bmp_bomb(height: int, width: int) -> bytes:
    """A 4×4 BMP whose DIB header claims ``height``×``width``."""
    ok, encoded = cv2.imencode(".bmp", np.zeros((4, 4, 3), np.uint8))
    assert ok
    data = bytearray(encoded.tobytes())
    struct.pack_into("<ii", data, 18, width, height)
    return bytes(data)


def peak_rss_mb(code: str, **values: Any) -> tuple[float, dict[str, Any]]:
    """Run ``code`` in a fresh Python with shardfeed importable; ``values`` are in scope as
    ``ARGS`` (JSON). Returns its peak resident memory in MB and what it put in ``RESULT``.

    The peak is the process's own (``VmHWM``): ``ru_maxrss`` would also count the test
    process it was forked from, whose high-water mark survives the exec."""
    program = textwrap.dedent("""
        import json, sys
        ARGS = json.loads(sys.argv[1])
        RESULT = {}
    """) + textwrap.dedent(code) + textwrap.dedent("""
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    RESULT["peak_mb"] = int(line.split()[1]) / 1024
        print("RESULT=" + json.dumps(RESULT))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, str(TESTS), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", program, json.dumps(values)],
                          capture_output=True, text=True, env=env, timeout=170,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT=")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT="):])
    return float(result["peak_mb"]), result
