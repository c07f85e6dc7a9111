"""The byte-source contract every storage backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shardfeed.storage.versions import ObjectVersion


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


@runtime_checkable
class PinnedSource(ByteSource, Protocol):
    """A :class:`ByteSource` that reads one version of its object and says when it is gone.

    After :meth:`pin`, every request for bytes asks the store for that version only (an
    ``If-Match`` of its ETag, or what the store offers): a read that finds the object
    rewritten raises :class:`~shardfeed.errors.ShardChangedError` instead of returning the
    new bytes as the old ones (or old bytes as new ones).
    """

    def pin(self, expected: ObjectVersion | None = None) -> ObjectVersion | None:
        """Read the version there now from the store (with the object's size: one HEAD) and
        read only it from now on; returns it (None: the store names no version, and reads
        are not checked). ``expected``: the version a listing gave when the reader opened;
        another one there now raises ShardChangedError."""
        ...
