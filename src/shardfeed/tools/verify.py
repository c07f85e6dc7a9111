"""Check a dataset: every record's framing and CRCs, optionally every image, and the manifest.

``verify(source)`` walks every shard record by record and lists each problem with its file,
record index and byte offset: bad length CRC, bad data CRC, truncated record, a record that is
not a ``tf.train.Example``, an undecodable image or mask (``decode=True``), a missing
referenced file, a shard whose size, checksum or record count differs from the manifest, an
index file that does not match its shard. After a bad length CRC the rest of the shard can only
be checked where an index says where the records start; otherwise the walk stops there.

Determinism: the report lists problems sorted by shard and offset, whatever ``workers``.
State: none. Memory: one read block (8 MiB) and one record per worker.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardfeed.errors import SchemaError, ShardfeedError, location
from shardfeed.format import spec
from shardfeed.format.crc import masked_crc32c
from shardfeed.tools import packfiles

BLOCK_BYTES = 8 << 20

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")

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
MISSING_REFERENCED = "missing referenced file"
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
    """What was checked in one shard."""

    path: str
    records: int
    bytes: int
    decoded: int
    problems: tuple[Problem, ...]
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "records": self.records, "bytes": self.bytes,
                "decoded": self.decoded, "problems": len(self.problems),
                "warnings": list(self.warnings)}


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
        return tuple(w for s in self.shards for w in s.warnings)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "manifest": self.manifest,
            "decode": self.decode,
            "shards": [s.to_json() for s in self.shards],
            "records": self.records,
            "bytes": sum(s.bytes for s in self.shards),
            "decoded": sum(s.decoded for s in self.shards),
            "problems": [p.to_json() for p in self.problems],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class _Expected:
    """What the manifest says about a shard (None: nothing known)."""

    records: int | None = None
    size: int | None = None
    checksum: int | None = None


@dataclass(frozen=True, slots=True)
class _Job:
    path: str
    expected: _Expected
    decode: bool
    root: str | None
    check_paths: bool
    image: Any
    mask: Any


class _Blocks:
    """Sequential reads through big blocks (one syscall per 8 MiB, not per record)."""

    def __init__(self, fh: Any, size: int) -> None:
        self.fh = fh
        self.size = size
        self.start = 0
        self.data = b""

    def read(self, offset: int, length: int) -> bytes:
        end = offset + length
        if offset >= self.start and end <= self.start + len(self.data):
            return self.data[offset - self.start:end - self.start]
        self.fh.seek(offset)
        self.data = self.fh.read(max(BLOCK_BYTES, length))
        self.start = offset
        return self.data[:length]


def _file_crc(path: str) -> int:
    import google_crc32c

    value = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(BLOCK_BYTES):
            value = int(google_crc32c.extend(value, chunk))
    return value


def _load_index(path: str) -> np.ndarray | None:
    """The shard's offsets from ``.idx.npy`` or ``.idx`` if one exists and parses."""
    from shardfeed.format.index import load_binary_index, read_text_index

    try:
        if os.path.isfile(spec.binary_index_path(path)):
            return np.asarray(load_binary_index(spec.binary_index_path(path), mmap=False))
        if os.path.isfile(spec.text_index_path(path)):
            return read_text_index(spec.text_index_path(path))
    except ShardfeedError:
        return None
    return None


def _check_shard(job: _Job, advance: Callable[[int], object]) -> ShardCheck:
    path = job.path
    problems: list[Problem] = []
    warnings: list[str] = []

    def problem(kind: str, detail: str, record: int | None = None, offset: int | None = None) -> None:
        problems.append(Problem(path, record, offset, kind, detail))

    if not os.path.isfile(path):
        problem(MISSING_FILE, "the shard does not exist; restore it, or rebuild the dataset")
        return ShardCheck(path, 0, 0, 0, tuple(problems))
    size = os.path.getsize(path)
    exp = job.expected
    if exp.size is not None and exp.size != size:
        problem(SIZE_MISMATCH, f"the file has {size} bytes, the manifest says {exp.size}; the "
                "shard changed after it was written: restore it, or re-run `shardfeed index`")
    elif exp.checksum is not None and _file_crc(path) != exp.checksum:
        problem(CHECKSUM_MISMATCH, "the file's CRC32C differs from the manifest; the shard "
                "changed after it was written: restore it, or re-run `shardfeed index`")
    if size == 0:
        if exp.records:
            problem(COUNT_MISMATCH, f"the file is empty, the manifest says {exp.records} records")
        else:
            warnings.append(f"file '{path}' is empty (no records); remove it if unintended")
        return ShardCheck(path, 0, 0, 0, tuple(problems), tuple(warnings))
    index = _load_index(path)
    offsets: list[int] = []
    decoded = 0
    with open(path, "rb") as fh:
        blocks = _Blocks(fh, size)
        pos, record, reported = 0, 0, 0
        while pos < size:
            header = blocks.read(pos, spec.HEADER_BYTES)
            if len(header) < spec.HEADER_BYTES:
                if record == 0 and _compressed(header):
                    problem(COMPRESSED, "the file is GZIP/ZLIB-compressed and cannot be read by "
                            "offset; convert it with `shardfeed pack FILE OUT --from-tfrecord`",
                            0, 0)
                    break
                problem(TRUNCATED, f"the file ends at byte {size} inside this record's header; "
                        f"{record} whole records precede it: re-create the shard", record, pos)
                break
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:spec.LENGTH_BYTES]) != length_crc:
                if record == 0 and _compressed(header):
                    problem(COMPRESSED, "the file is GZIP/ZLIB-compressed and cannot be read by "
                            "offset; convert it with `shardfeed pack FILE OUT --from-tfrecord`",
                            0, 0)
                    break
                if record == 0 and index is None:
                    problem(NOT_TFRECORD, "the first record's length CRC does not match: this "
                            "is not a TFRecord file (or its first header is damaged)", 0, 0)
                    break
                resume_at = _next_indexed(index, record, pos)
                tail = ("the rest of the shard is checked at the offsets of its index"
                        if resume_at is not None else
                        "records after it cannot be located without an index and were not "
                        "checked")
                problem(BAD_LENGTH_CRC, f"the record header is damaged; {tail}. Re-create the "
                        "shard from its source", record, pos)
                if resume_at is None:
                    break
                offsets.append(pos)
                pos, record = resume_at, record + 1
                continue
            end = pos + spec.FRAMING_BYTES + length
            if end > size:
                problem(TRUNCATED, f"the record needs {spec.FRAMING_BYTES + length} bytes but "
                        f"the file ends at byte {size}; {record} whole records precede it: "
                        f"re-create the shard, or truncate it to {pos} bytes", record, pos)
                break
            body = blocks.read(pos + spec.HEADER_BYTES, length + spec.CRC_BYTES)
            payload = body[:length]
            (data_crc,) = _CRC.unpack_from(body, length)
            if masked_crc32c(payload) != data_crc:
                problem(BAD_DATA_CRC, "the record's bytes are damaged; re-create the shard from "
                        "its source, or read with on_error='skip'", record, pos)
            elif job.decode or job.check_paths:
                decoded += _check_payload(job, payload, record, pos, problem)
            offsets.append(pos)
            pos, record = end, record + 1
            if pos - reported >= BLOCK_BYTES:
                advance(pos - reported)
                reported = pos
        advance(size - reported)
    if index is not None and not problems:
        walked = np.asarray(offsets + [size], dtype=np.uint64)
        if walked.shape != index.shape or bool(np.any(walked != index)):
            problem(INDEX_MISMATCH, f"the index lists {index.size - 1} records, the file holds "
                    f"{len(offsets)}; the shard changed after indexing: re-run `shardfeed index`")
    if exp.records is not None and len(offsets) != exp.records and not problems:
        problem(COUNT_MISMATCH, f"the file holds {len(offsets)} records, the manifest says "
                f"{exp.records}; re-run `shardfeed index`")
    return ShardCheck(path, len(offsets), size, decoded, tuple(problems), tuple(warnings))


def _compressed(head: bytes) -> bool:
    if head[:2] == spec.GZIP_MAGIC:
        return True
    return len(head) >= 2 and head[0] == spec.ZLIB_FIRST_BYTE and head[1] in spec.ZLIB_SECOND_BYTES


def _next_indexed(index: np.ndarray | None, record: int, pos: int) -> int | None:
    if index is None or record + 1 >= index.size or int(index[record]) != pos:
        return None
    return int(index[record + 1])


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one image (or mask) is in a record: key, encoding, shape keys."""

    key: str
    encoding: str
    height_key: str | None = None
    width_key: str | None = None
    channels_key: str | None = None


_DEFAULT_SLOTS = (
    ("image", (_Slot(spec.IMAGE_ENCODED, "mixed"),
               _Slot(spec.IMAGE_RAW, "raw", spec.IMAGE_HEIGHT, spec.IMAGE_WIDTH,
                     spec.IMAGE_CHANNELS),
               _Slot(spec.IMAGE_PATH, "path"))),
    ("mask", (_Slot(spec.MASK_ENCODED, "mixed"),
              _Slot(spec.MASK_RAW, "raw", spec.MASK_HEIGHT, spec.MASK_WIDTH),
              _Slot("mask/path", "path"))),
)


def _slot(info: Any) -> _Slot | None:
    if info is None:
        return None
    return _Slot(info.key, info.encoding, info.height_key, info.width_key, info.channels_key)


def _dim(features: dict[str, Any], key: str | None) -> int | None:
    value = features.get(key) if key else None
    if isinstance(value, np.ndarray) and value.size == 1:
        return int(value.reshape(-1)[0])
    return None


def _check_payload(
    job: _Job, payload: bytes, record: int, offset: int,
    problem: Callable[[str, str, int | None, int | None], None],
) -> int:
    """Parse the record, check referenced files, and (``job.decode``) decode images.
    Returns the number of images and masks decoded."""
    from shardfeed.format.example import decode_example

    where = location(job.path, record, offset)
    try:
        features = decode_example(payload, where=where)
    except SchemaError as exc:
        problem(NOT_EXAMPLE, str(exc), record, offset)
        return 0
    count = 0
    for role, defaults in _DEFAULT_SLOTS:
        given = _slot(job.image if role == "image" else job.mask)
        slots = (given,) if given is not None else defaults
        kind = UNDECODABLE_IMAGE if role == "image" else UNDECODABLE_MASK
        for slot in slots:
            value = features.get(slot.key)
            if not isinstance(value, bytes):
                continue
            if slot.encoding == "path":
                rel = value.decode("utf-8", "replace")
                full = rel if os.path.isabs(rel) or job.root is None else os.path.join(job.root, rel)
                if not os.path.isfile(full):
                    problem(MISSING_REFERENCED, f"{role} '{full}' does not exist; restore it, or "
                            "pass the right --root", record, offset)
                elif job.decode:
                    with open(full, "rb") as f:
                        count += _try_decode(f.read(), where, kind, record, offset, problem,
                                             gray=role == "mask")
            elif not job.decode:
                continue
            elif slot.encoding == "raw":
                h, w = _dim(features, slot.height_key), _dim(features, slot.width_key)
                c = _dim(features, slot.channels_key) if slot.channels_key else 1
                want = h * w * c if h is not None and w is not None and c is not None else None
                if want != len(value):
                    problem(kind, f"raw {role} holds {len(value)} bytes, but height × width × "
                            f"channels = {h} × {w} × {c}", record, offset)
                else:
                    count += 1
            else:
                count += _try_decode(value, where, kind, record, offset, problem,
                                     gray=role == "mask")
    return count


def _try_decode(
    data: bytes, where: str, kind: str, record: int, offset: int,
    problem: Callable[[str, str, int | None, int | None], None], *, gray: bool,
) -> int:
    from shardfeed.errors import DecodeError
    from shardfeed.transforms.decode import decode_image

    try:
        decode_image(data, mode="gray" if gray else "unchanged", where=where)
    except DecodeError as exc:
        problem(kind, str(exc), record, offset)
        return 0
    return 1


def _expected_from_manifest(
    manifest_path: str,
) -> tuple[list[str], list[_Expected], str | None, Any, Any, bool]:
    """Shard paths, what the manifest says of each, the root, image key, mask key, and
    whether the records reference image files."""
    from shardfeed.format.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    base = os.path.dirname(os.path.abspath(manifest_path))
    paths, expected = [], []
    for shard in manifest.shards:
        p = shard.path if os.path.isabs(shard.path) or "://" in shard.path else os.path.join(base, shard.path)
        paths.append(p)
        expected.append(_Expected(records=shard.records, size=shard.bytes, checksum=shard.crc32c))
    root = manifest.root
    if root is not None and not os.path.isabs(root) and "://" not in root:
        root = os.path.join(base, root)
    schema = manifest.schema
    image = schema.image if schema is not None else None
    mask = schema.mask if schema is not None else None
    return paths, expected, root, image, mask, manifest.mode == "referenced"


def _sampled_slots(paths: Sequence[str]) -> tuple[Any, Any]:
    """Image and mask info inferred from the first records of the first readable file
    (files without a manifest); (None, None) when nothing can be read."""
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import scan, unframe
    from shardfeed.format.schema import infer_schema

    for path in paths:
        try:
            offsets = scan(path)
            if offsets.size < 2:
                continue
            with open(path, "rb") as f:
                data = f.read(int(offsets[min(16, offsets.size - 1)]))
            records = [
                decode_example(unframe(data[int(a):int(b)], path=path, record=i, offset=int(a)))
                for i, (a, b) in enumerate(itertools.pairwise(offsets[:17].tolist()))
            ]
            schema = infer_schema(records)
        except (ShardfeedError, OSError):
            continue
        return schema.image, schema.mask
    return None, None


def verify(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    decode: bool = False,
    root: str | os.PathLike[str] | None = None,
    workers: int = 1,
    progress: bool = False,
) -> VerifyReport:
    """Check every record of a dataset; see the module docstring for what is checked.

    ``source``: a dataset folder or manifest (then sizes, checksums and record counts are
    checked against it), a folder of TFRecord files, a glob or a list of files. ``root``:
    where referenced images live (default: the manifest's root). ``workers`` shards are
    checked at once. Never raises for bad data: every problem is in the report.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    manifest_path = None
    if isinstance(source, (str, os.PathLike)):
        manifest_path = packfiles.find_manifest(source)
    image = mask = None
    referenced = False
    if manifest_path is not None:
        paths, expected, mroot, image, mask, referenced = _expected_from_manifest(manifest_path)
    else:
        paths = packfiles.expand_inputs(source)
        expected = [_Expected()] * len(paths)
        mroot = None
        if decode:
            image, mask = _sampled_slots(paths)
    use_root = os.fspath(root) if root is not None else mroot
    check_paths = referenced or root is not None
    jobs = [
        _Job(p, e, decode, use_root, check_paths, image, mask) for p, e in zip(paths, expected)
    ]
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    from tqdm import tqdm

    lock = threading.Lock()
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        if workers == 1 or len(jobs) == 1:
            checks = [_check_shard(j, advance) for j in jobs]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                checks = list(pool.map(lambda j: _check_shard(j, advance), jobs))
    problems = tuple(p for c in checks for p in c.problems)
    return VerifyReport(shards=tuple(checks), manifest=manifest_path, decode=decode,
                        problems=problems)
