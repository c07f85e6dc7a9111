"""How much of an input ``pack`` reads at once, and the largest value, record and JSON member
it packs: checked from the sizes an input states before the bytes are read.

One knob sets them all, ``max_pixels`` (the most pixels an image may claim; 2^27 by
default), so that the images a loader with that limit decodes can always be packed::

    limit            bytes                    default     where the size is read
    one value        8 × max_pixels + 1 MiB   1 GiB + 1   a tar member's header; a Parquet
                                              MiB         page header; an Arrow row's offsets
    one record       9 × max_pixels + 2 MiB   1.1 GiB     a tar sample's headers, summed as
                                                          they come; a row's values
    one JSON member  max_pixels / 8           16 MiB      the member's header

A value is an image at 8 bytes a pixel (4 channels of 16 bits, uncompressed) with 1 MiB of
headers; a record is that image, a mask of 1 byte a pixel and 2 MiB of everything else.
A JSON member is held to less: parsed into Python objects, JSON takes up to about 25 times
its size (``[[],[],...]``: 3 bytes a 64-byte list), so 16 MiB of JSON stays within the
bound of one record.

Memory: what ``pack`` holds of one input is at most :data:`BATCH_BYTES` of rows being
converted (or one row, when a row is larger) and the record being encoded; the largest
record takes about three times its bytes while it is encoded (the values, the Example, its
bytes). Python objects are counted at :data:`OBJECT_BYTES` each beyond their bytes.

Determinism: the limits are a function of ``max_pixels`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, check_max_pixels

BATCH_BYTES = 64 << 20
"""The most bytes of rows read from a table and converted to Python objects at once (one
row, when a row is larger)."""

OBJECT_BYTES = 48
"""What a Python object costs beyond its bytes, counted for each value of a row (an int: 28
bytes and an 8-byte reference; a bytes object 33 and 8)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IngestLimits:
    """The largest value, record and JSON member packed, in bytes (see the module
    docstring); :meth:`of` gives them for a ``max_pixels``."""

    max_pixels: int
    value_bytes: int
    record_bytes: int
    json_bytes: int

    @classmethod
    def of(cls, max_pixels: int = DEFAULT_MAX_PIXELS) -> IngestLimits:
        """The limits that go with ``max_pixels``."""
        check_max_pixels(max_pixels)
        return cls(max_pixels=max_pixels, value_bytes=8 * max_pixels + (1 << 20),
                   record_bytes=9 * max_pixels + (2 << 20),
                   json_bytes=max(max_pixels // 8, 64 << 10))

    @property
    def raise_it(self) -> str:
        """What to do when a genuine input is over a limit, in words."""
        return (f"every limit of pack grows with max_pixels (now {self.max_pixels}): raise "
                "it (--max-pixels) if the input is genuine")


__all__ = ["BATCH_BYTES", "OBJECT_BYTES", "IngestLimits"]
