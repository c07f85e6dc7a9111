"""What :func:`shardfeed.tools.verify.verify` reports: problems, per-shard checks, the report.

Every problem names its file, record index and byte offset (where known) and its kind, one of
the constants below, and says what to do in ``detail``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardfeed.errors import location

__all__ = [
    "BAD_DATA_CRC",
    "BAD_LENGTH_CRC",
    "CHECKSUM_MISMATCH",
    "COMPRESSED",
    "COUNT_MISMATCH",
    "INDEX_MISMATCH",
    "MASK_SIZE_MISMATCH",
    "MISSING_FILE",
    "MISSING_REFERENCED",
    "NOT_EXAMPLE",
    "NOT_TFRECORD",
    "REFUSED_PATH",
    "SIZE_MISMATCH",
    "TRUNCATED",
    "UNDECODABLE_IMAGE",
    "UNDECODABLE_MASK",
    "Problem",
    "ShardCheck",
    "VerifyReport",
]

# problem kinds
MISSING_FILE = "missing file"
NOT_TFRECORD = "not a TFRecord"
COMPRESSED = "compressed"
TRUNCATED = "truncated"
BAD_LENGTH_CRC = "bad length CRC"
BAD_DATA_CRC = "bad data CRC"
NOT_EXAMPLE = "not an Example"
UNDECODABLE_IMAGE = "undecodable image"
UNDECODABLE_MASK = "undecodable mask"
MASK_SIZE_MISMATCH = "mask size differs from image"
MISSING_REFERENCED = "missing referenced file"
REFUSED_PATH = "refused referenced path"
SIZE_MISMATCH = "size differs from manifest"
CHECKSUM_MISMATCH = "checksum differs from manifest"
COUNT_MISMATCH = "record count differs from manifest"
INDEX_MISMATCH = "index does not match"


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong: where (file, record index, byte offset) and what."""

    path: str
    record: int | None
    offset: int | None
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{location(self.path, self.record, self.offset)}: {self.kind}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "record": self.record, "offset": self.offset,
                "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ShardCheck:
    """What was checked in one shard. ``decoded``: images and masks decoded, of which
    ``masks_decoded`` masks."""

    path: str
    records: int
    bytes: int
    decoded: int
    problems: tuple[Problem, ...]
    warnings: tuple[str, ...] = ()
    masks_decoded: int = 0

    @property
    def images_decoded(self) -> int:
        return self.decoded - self.masks_decoded

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "records": self.records, "bytes": self.bytes,
                "decoded": self.decoded, "images_decoded": self.images_decoded,
                "masks_decoded": self.masks_decoded, "problems": len(self.problems),
                "warnings": list(self.warnings)}


NO_IMAGE_FOUND = ("--decode found no image in any record under the names it looked for (the "
                  "manifest's schema, else image/encoded, image/raw, image/path): name the "
                  "image's feature (verify(image=...), --key; a mask's: mask=..., --mask-key)")
"""The warning of a decode that found nothing to decode (records of other feature names)."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The result of :func:`verify`: per-shard checks and every problem, in file order."""

    shards: tuple[ShardCheck, ...]
    manifest: str | None = None
    decode: bool = False
    problems: tuple[Problem, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def warnings(self) -> tuple[str, ...]:
        found = tuple(w for s in self.shards for w in s.warnings)
        if (self.decode and self.records and not self.problems
                and not sum(s.images_decoded for s in self.shards)):
            found += (NO_IMAGE_FOUND,)
        return found

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "manifest": self.manifest,
            "decode": self.decode,
            "shards": [s.to_json() for s in self.shards],
            "records": self.records,
            "bytes": sum(s.bytes for s in self.shards),
            "decoded": sum(s.decoded for s in self.shards),
            "images_decoded": sum(s.images_decoded for s in self.shards),
            "masks_decoded": sum(s.masks_decoded for s in self.shards),
            "problems": [p.to_json() for p in self.problems],
            "warnings": list(self.warnings),
        }
