"""The byte-source contract every storage backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class ByteSource(Protocol):
    """Random access to the bytes of one file, local or remote. Thread-safe.

    ``read`` returns fewer bytes than asked only at end of file; callers that need exactly
    ``length`` bytes check and raise CorruptRecordError themselves (it knows the record).
    """

    url: str

    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...

    def read_ranges(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Read many ``(offset, length)`` ranges; one bytes object per range, same order."""
        ...

    def close(self) -> None: ...
