"""CRC32C (Castagnoli) and TensorFlow's masked CRC, computed in C by ``google-crc32c``."""

from __future__ import annotations

import google_crc32c

from shardfeed.format.spec import CRC_MASK_DELTA

_MASK32 = 0xFFFFFFFF

crc32c_of_bytes = google_crc32c.value
"""CRC32C of a ``bytes`` object (no other buffer type), unmasked: :func:`crc32c` without
its checks, for loops over many small records."""

Buffer = bytes | bytearray | memoryview


def crc32c(data: Buffer) -> int:
    """CRC32C of ``data`` as an unsigned 32-bit integer.

    The C extension takes only ``bytes``; other buffers are copied first (a memcpy, far
    cheaper than the CRC's callers' other work), so pass ``bytes`` where you have them.
    """
    if type(data) is not bytes:
        data = bytes(data)
    return int(google_crc32c.value(data))


def mask(crc: int) -> int:
    """TensorFlow's CRC mask: rotate right by 15 bits and add ``0xa282ead8`` (mod 2**32)."""
    return ((((crc >> 15) | (crc << 17)) & _MASK32) + CRC_MASK_DELTA) & _MASK32


def unmask(masked: int) -> int:
    """Inverse of :func:`mask`."""
    rot = (masked - CRC_MASK_DELTA) & _MASK32
    return ((rot >> 17) | (rot << 15)) & _MASK32


def masked_crc32c(data: Buffer) -> int:
    """Masked CRC32C of ``data``, as stored in TFRecord framing."""
    # crc32c and mask inlined: two CRCs a record, where each Python call shows on small ones
    crc = int(crc32c_of_bytes(data if type(data) is bytes else bytes(data)))
    return ((((crc >> 15) | (crc << 17)) & _MASK32) + CRC_MASK_DELTA) & _MASK32
