"""``pack --from-tfrecord``: re-pack existing TFRecord files (plain, GZIP or ZLIB) into
indexed, uncompressed shards, records unchanged and in input order.

Compressed files cannot be read by offset, so they are streamed: one pass to learn the record
sizes (for the plan and its digest), one to write. Every record's CRCs are checked on the way;
a damaged input stops the pack with the file, record and (uncompressed) offset.

Determinism: output bytes depend on the input records and the options only. State: the saved
plan, as for ``pack``. Memory: one record at a time.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from shardfeed.errors import CorruptRecordError, PackError, location
from shardfeed.format import spec
from shardfeed.format.crc import masked_crc32c
from shardfeed.tools.discovery import expand_inputs
from shardfeed.tools.pack import output as packoutput
from shardfeed.tools.pack.errors import output_errors
from shardfeed.tools.pack.kept import already_complete
from shardfeed.tools.pack.ledger import planned_files, record_done
from shardfeed.tools.pack.output import PackResult
from shardfeed.tools.pack.plan import PackPlan, plan_shards

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")


class _ZlibReader:
    """A minimal read-only stream over a ZLIB-compressed file."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.z = zlib.decompressobj()
        self.buf = b""

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.fh.read(1 << 20)
            if not chunk:
                self.buf += self.z.flush()
                break
            self.buf += self.z.decompress(chunk)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def close(self) -> None:
        self.fh.close()


def _open_stream(path: str) -> Any:
    fh = open(path, "rb")  # noqa: SIM115 - returned open, closed by read_records
    head = fh.read(2)
    fh.seek(0)
    if head == spec.GZIP_MAGIC:
        return gzip.GzipFile(fileobj=fh, mode="rb")
    if len(head) == 2 and head[0] == spec.ZLIB_FIRST_BYTE and head[1] in spec.ZLIB_SECOND_BYTES:
        first = fh.read(spec.HEADER_BYTES)
        fh.seek(0)
        # a plain TFRecord may start with these bytes too: its length CRC tells them apart
        if len(first) < spec.HEADER_BYTES or masked_crc32c(first[:8]) != _HEADER.unpack(first)[1]:
            return _ZlibReader(fh)
    return fh


def read_records(path: str) -> Iterator[bytes]:
    """Every payload of a TFRecord file (plain, GZIP or ZLIB), CRCs checked, in order."""
    try:
        stream = _open_stream(path)
    except FileNotFoundError:
        raise PackError(f"input file '{path}' does not exist; check the path") from None
    try:
        pos, record = 0, 0
        while True:
            try:
                header = stream.read(spec.HEADER_BYTES)
            except (OSError, EOFError, zlib.error) as exc:
                raise PackError(
                    f"{location(path, record)}: cannot decompress ({exc}); the file is damaged"
                ) from None
            if not header:
                return
            if len(header) < spec.HEADER_BYTES:
                raise _corrupt(path, record, pos, "truncated inside a record header")
            length, length_crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != length_crc:
                if record == 0:
                    raise PackError(
                        f"file '{path}' is not a TFRecord file (the length CRC of its first "
                        "record does not match); check the path"
                    )
                raise _corrupt(path, record, pos, "bad length CRC")
            try:
                body = stream.read(length + spec.CRC_BYTES)
            except (OSError, EOFError, zlib.error) as exc:
                raise PackError(
                    f"{location(path, record, pos)}: cannot decompress ({exc}); the file is "
                    "damaged"
                ) from None
            if len(body) < length + spec.CRC_BYTES:
                raise _corrupt(path, record, pos, "truncated")
            payload = body[:length]
            if masked_crc32c(payload) != _CRC.unpack_from(body, length)[0]:
                raise _corrupt(path, record, pos, "bad data CRC")
            yield payload
            pos += spec.FRAMING_BYTES + length
            record += 1
    finally:
        stream.close()


def _corrupt(path: str, record: int, pos: int, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"{location(path, record, pos)}: {what} (offset in the uncompressed stream); the input "
        "is damaged: re-create it, or remove the damaged file from the inputs",
        path=path, record=record, offset=pos,
    )


def pack_tfrecords(
    inputs: Sequence[str], out: str, *, options: Any, resume: bool, overwrite: bool,
    progress: bool, on_shard: Callable[[str], object] | None = None,
) -> PackResult:
    """Re-pack ``inputs`` into ``out``; see the module docstring. Returns a PackResult."""
    files = expand_inputs(inputs)
    for f in files:
        if os.path.abspath(os.path.dirname(f)) == out:
            raise PackError(
                f"input '{f}' is inside the output folder '{out}'; choose another output folder"
            )
    packoutput.check_output(out, resume=resume, overwrite=overwrite)
    sizes: list[int] = []
    lines: list[str] = []
    for f in files:
        st = os.stat(f)
        lens = [len(p) for p in read_records(f)]
        sizes.extend(n + spec.FRAMING_BYTES for n in lens)
        lines.append(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns}:{len(lens)}")
    keys = [(0, 0.0, i) for i in range(len(sizes))]
    plan = plan_shards(
        keys, sizes, records_per_shard=options.records_per_shard,
        shard_bytes=options.shard_bytes, prefix=options.prefix,
        fingerprint={"from_tfrecord": packoutput.digest_lines(lines)},
    )
    planned = planned_files(plan, [spec.MANIFEST_NAME])
    with output_errors(out):
        if resume and packoutput.is_complete(out):
            done = already_complete(out, plan, mode="tfrecord", progress=progress)
            return PackResult(
                output=out, manifest=os.path.join(out, spec.MANIFEST_NAME),
                shards=len(done.shards), records=done.num_records,
                bytes=sum(s.bytes for s in done.shards), kept_shards=len(done.shards),
                already_complete=True,
            )
        saved = packoutput.prepare(out, plan, planned=planned, resume=resume,
                                   overwrite=overwrite)
        kept = packoutput.reconcile(out, plan, saved, progress=progress)
        packoutput.save_plan(out, plan, planned=planned, kept=kept)
        infos = _write(files, out, plan, kept, total=len(sizes), progress=progress,
                       on_shard=on_shard)
        manifest = packoutput.write_manifest(
            out, [infos[s.index] for s in plan.shards], mode="tfrecord", root=None,
            label_key=None, vocabularies={}, group_key=None, order_key=None, group_ids=None,
            order_keys=None,
            extra={"pack_files": [n for n in planned if n != spec.MANIFEST_NAME]},
        )
        packoutput.remove_plan(out)
    return PackResult(
        output=out, manifest=manifest, shards=len(plan.shards), records=len(sizes),
        bytes=sum(int(infos[s.index].bytes) for s in plan.shards), kept_shards=len(kept),
    )


def _write(
    files: Sequence[str], out: str, plan: PackPlan, kept: dict[int, Any], *, total: int,
    progress: bool, on_shard: Callable[[str], object] | None,
) -> dict[int, Any]:
    """Write the shards of ``plan`` not in ``kept`` from the records of ``files``, in order;
    return every shard's ShardInfo."""
    from tqdm import tqdm

    infos: dict[int, Any] = dict(kept)

    def stream() -> Iterator[bytes]:
        for f in files:
            yield from read_records(f)

    payloads = stream()
    with tqdm(total=total, unit="rec", desc="pack", disable=not progress) as bar:
        for shard in plan.shards:
            if shard.index in kept:
                for _ in range(shard.records):
                    next(payloads)
                bar.update(shard.records)
                continue

            def take(n: int = shard.records) -> Iterator[bytes]:
                for _ in range(n):
                    yield next(payloads)
                    bar.update(1)

            path = os.path.join(out, shard.name)
            infos[shard.index] = packoutput.write_shard(path, take())
            record_done(out, infos[shard.index])
            if on_shard is not None:
                on_shard(path)
    return infos
