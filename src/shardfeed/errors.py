"""The exception hierarchy.

Everything shardfeed raises on purpose derives from :class:`ShardfeedError`, except argument
errors, which are ``ValueError``/``TypeError`` naming the value and the fix. Messages name the
file, the record index and byte offset where there is one, and say what to do.
"""

from __future__ import annotations


class ShardfeedError(Exception):
    """Root of every error shardfeed raises on purpose."""


class FormatError(ShardfeedError):
    """A file is not what it should be: not a TFRecord, compressed, a stale index, a bad manifest."""


class CorruptRecordError(FormatError):
    """One record of a shard is damaged: bad length CRC, bad data CRC, truncated.

    Carries ``path``, ``record`` (index within the shard, or None if unknown) and ``offset``.
    """

    def __init__(
        self, message: str, *, path: str, record: int | None, offset: int | None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.record = record
        self.offset = offset


class SchemaError(ShardfeedError):
    """A record does not match the feature spec, or a requested feature does not exist."""


class DecodeError(ShardfeedError):
    """An image could not be decoded. Carries the same location fields as CorruptRecordError."""

    def __init__(
        self, message: str, *, path: str | None = None, record: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.record = record
        self.offset = offset


class UnsafePathError(FormatError):
    """A path a dataset names is refused: it leads outside the dataset (``..`` steps, an
    absolute path, another URL scheme or bucket, a symbolic link out), or it is no path at all
    (a NUL byte, not UTF-8). ``named`` is the path as the dataset gives it. Datasets that are
    meant to reference files elsewhere open with ``allow_outside_paths=True``, which reads
    those files as part of the dataset: a folder whose manifest also names another folder's
    shards (``train/`` naming ``../val/*``) is indexed on its own instead
    (``shardfeed index train/``), as its refusal says."""

    def __init__(self, message: str, *, named: str = "") -> None:
        super().__init__(message)
        self.named = named


class UnsafeRecordPathError(UnsafePathError, DecodeError):
    """A record's referenced image path is refused (see :class:`UnsafePathError`). Also a
    :class:`DecodeError`: the image cannot be had, so ``on_error="skip"`` replaces the sample.
    ``path``/``record``/``offset`` locate the record when known."""

    def __init__(
        self, message: str, *, named: str = "", path: str | None = None,
        record: int | None = None, offset: int | None = None,
    ) -> None:
        super().__init__(message, named=named)
        self.path = path
        self.record = record
        self.offset = offset


class StateError(ShardfeedError):
    """A saved loader state cannot be restored here (missing or foreign keys, other dataset)."""


class StorageError(ShardfeedError):
    """Permanent storage failure (no such bucket, access denied, missing object); names the URL."""


class ShardChangedError(StorageError):
    """A shard was rewritten, replaced or removed since the Dataset opened it: its index and
    the records read so far describe bytes that are no longer there, so none is read.
    Carries ``path``, ``opened`` (the version the Dataset read) and ``found`` (the one there
    now; None where the store only refused the old one). Open the Dataset again."""

    def __init__(self, message: str, *, path: str, opened: str, found: str | None) -> None:
        super().__init__(message)
        self.path = path
        self.opened = opened
        self.found = found


class PackError(ShardfeedError):
    """The input to pack is unusable: a CSV column missing, a label not a number, a file missing,
    or an output folder that is not empty."""


class TooManyErrorsError(ShardfeedError):
    """More bad samples in one epoch than ``on_error="skip"`` allows."""


class MissingDependencyError(ShardfeedError):
    """An optional package the demo needs is not installed."""


def location(path: str, record: int | None = None, offset: int | None = None) -> str:
    """Format a location the same way in every message: ``file 'a.tfrecord', record 5 at byte 1234``."""
    text = f"file '{path}'"
    if record is not None:
        text += f", record {record}"
    if offset is not None:
        text += f" at byte {offset}"
    return text
