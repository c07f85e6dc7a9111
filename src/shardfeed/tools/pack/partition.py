"""Packing in parts: a partition writer for each task, one merge for the whole dataset.

::

    task p (any engine, any attempt a)              driver
    ----------------------------------              ------
    rows --payloads--> _parts/p-a/part-K.tfrecord   merge(partials): one partial a partition
    (+ indexes, each shard complete or absent)        (the first attempt that finished), counts
    returns Partial(p, a, shards)                     and sizes checked, the final names
                                                      saved (_parts/merge.json), shards renamed
                                                      in partition order, manifest written
                                                      last, _parts/ removed (attempts that did
                                                      not finish: retries, speculative copies)

A task writes only under its own attempt folder, so a task killed mid-write (and retried)
leaves files that the merge removes; a partial is what a *finished* attempt returns, so the
merge never takes a half-written one. The records' global order is partition order, then
row order within a partition: it does not depend on which task ran where or when, and with
it neither do the exact shuffle or a saved state. A single-machine pack of the same rows is
one partition through the same code: the same records in the same order.

A driver killed mid-merge leaves no manifest, some or all shards under their final names and
``_parts/`` with the journal of the final names: readers refuse the folder (the parts folder
without a manifest is a sign of an unfinished pack, see :mod:`shardfeed.dataset.unfinished`),
and :func:`clear_unfinished`, which the next pack into the folder runs first, removes
exactly the files the journal names, then ``_parts/``. Killed after the manifest, only the
removal of ``_parts/`` was left: the dataset is whole, and the next pack's clean-up removes
the parts folder.

``output`` may be an object-storage URL (``s3://bucket/ds``): a task builds each part in a
local temporary folder and uploads it (indexes first, each object atomic), then deletes it
locally; the merge checks sizes (and CRC32Cs) by request, renames by copy-then-delete and
writes the manifest last, so a reader never sees a dataset before it is whole.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.format.manifest import ShardInfo
from shardfeed.storage import files
from shardfeed.tools.pack.output import write_shard
from shardfeed.tools.pack.rows import RowFields, row_payload
from shardfeed.tools.pack.workers import ordered_map
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

PARTS_FOLDER = spec.PARTS_FOLDER
"""The folder of the output that tasks write into; removed by the merge."""

log = logging.getLogger("shardfeed.tools.pack")


@dataclass(frozen=True, slots=True)
class PartSizes:
    """Where a partition cuts its shards: after ``records`` records, or once a shard holds
    ``bytes`` bytes (exactly one is set)."""

    records: int | None = None
    bytes: int | None = None

    def __post_init__(self) -> None:
        if (self.records is None) == (self.bytes is None):
            raise ValueError("give exactly one of records_per_shard or shard_size")
        if (self.records or 1) < 1 or (self.bytes or 1) < 1:
            raise ValueError(f"shard sizes must be >= 1, got {self}")


@dataclass(frozen=True, slots=True)
class Partial:
    """What one finished attempt at partition ``partition`` wrote: its shards (paths relative
    to the output folder), in row order. JSON-able (:meth:`to_json`) to travel back to a
    driver."""

    partition: int
    attempt: str
    shards: tuple[ShardInfo, ...]
    label_key: str | None = None

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "attempt": self.attempt,
                "label_key": self.label_key,
                "shards": [[s.path, s.records, s.bytes, s.crc32c, s.records_hash]
                           for s in self.shards]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Partial:
        return cls(int(data["partition"]), str(data["attempt"]),
                   tuple(ShardInfo(*row[:3], *row[3:5]) for row in data["shards"]),
                   data.get("label_key"))


def attempt_folder(output: str, partition: int, attempt: str) -> str:
    return files.join(output, PARTS_FOLDER, f"{partition:06d}-{attempt}")


def remove_parts(output: str) -> None:
    """Remove the parts folder of ``output`` (every attempt's files), if there is one."""
    files.remove_tree(files.join(output, PARTS_FOLDER))


def write_partition(
    rows: Iterable[Mapping[str, Any]], output: str | os.PathLike[str], *, partition: int,
    fields: RowFields | None = None, sizes: PartSizes | None = None,
    attempt: str | None = None, workers: int = 1, max_pixels: int = DEFAULT_MAX_PIXELS,
    where: str = "row",
) -> Partial:
    """Write the records of ``rows`` as shards of partition ``partition`` (an int >= 0: the
    partitions' order is the records' order) under ``output``; return the :class:`Partial`
    to hand to :func:`merge_partitions`. ``attempt`` names this try (default: random), so
    that retries and speculative copies never write over each other. A bad row raises
    PackError naming its position in the partition."""
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"partition must be an int >= 0, got {partition!r}")
    fields = fields or RowFields()
    sizes = sizes or PartSizes(bytes=64 << 20)
    attempt = attempt or uuid.uuid4().hex[:12]
    out = os.fspath(output)
    folder = attempt_folder(out, partition, attempt)
    staging = tempfile.mkdtemp(prefix="shardfeed-part-") if files.is_remote(out) else None
    if staging is None:
        os.makedirs(folder, exist_ok=True)
    label = fields.label

    def build(item: tuple[int, Mapping[str, Any]]) -> bytes:
        i, row = item
        return row_payload(row, fields, where=f"{where} {i} of partition {partition}",
                           max_pixels=max_pixels)

    def numbered() -> Iterator[tuple[int, Mapping[str, Any]]]:
        nonlocal label
        for i, row in enumerate(rows):
            if label is None:  # the first label column; a mask is no label
                columns = [c for c in fields.label_columns(row)
                           if c not in (spec.MASK_ENCODED, spec.MASK_FORMAT)]
                label = columns[0] if columns else ""
            yield i, row

    payloads = ordered_map(build, numbered(), workers=workers)
    shards = []
    relative = f"{PARTS_FOLDER}/{partition:06d}-{attempt}"
    try:
        for k, chunk in enumerate(_cut(payloads, sizes)):
            name = f"part-{k:05d}{spec.SHARD_SUFFIX}"
            info = write_shard(os.path.join(staging or folder, name), chunk)
            if staging is not None:
                _upload(staging, name, folder)
            shards.append(replace(info, path=f"{relative}/{name}"))
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return Partial(partition, attempt, tuple(shards), label or None)


def _upload(staging: str, name: str, folder: str) -> None:
    """Upload a part built in ``staging`` and its indexes to ``folder`` (the indexes first:
    a part never stands without them), deleting each local file once uploaded."""
    for local_name in _shard_files(name)[::-1]:
        path = os.path.join(staging, local_name)
        if os.path.exists(path):
            files.upload_file_atomic(path, files.join(folder, local_name))
            os.remove(path)


def _cut(payloads: Iterator[bytes], sizes: PartSizes) -> Iterator[list[bytes]]:
    """The payloads in shards: ``sizes.records`` each, or cut after the record that takes a
    shard to ``sizes.bytes`` (a function of the payloads only)."""
    chunk: list[bytes] = []
    size = 0
    for payload in payloads:
        chunk.append(payload)
        size += len(payload) + spec.FRAMING_BYTES
        if (sizes.records is not None and len(chunk) >= sizes.records) or (
                sizes.bytes is not None and size >= sizes.bytes):
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def merge_partitions(
    output: str | os.PathLike[str], partials: Iterable[Partial | Mapping[str, Any]], *,
    partitions: int | None = None, prefix: str = "shard", verify: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Make one dataset of the partials' shards in ``output``; return the manifest's path.

    One partial a partition is kept (of several, the first by attempt name: a retry or a
    speculative copy wrote the same rows); ``partitions`` (when given) must all be there.
    Each kept shard must be on disk with the size its partial says (``verify``: and its
    CRC32C). The final names are saved in the parts folder's journal, shards are renamed
    ``prefix-NNNNN-of-NNNNN.tfrecord`` in partition order, the manifest written last, and the
    parts folder (every attempt not kept, the journal) removed.
    """
    out = os.fspath(output)
    chosen = _choose([p if isinstance(p, Partial) else Partial.from_json(p) for p in partials])
    if partitions is not None:
        missing = sorted(set(range(partitions)) - set(chosen))
        if missing:
            raise PackError(f"partition(s) {missing[:10]} of {partitions} have no finished "
                            f"part in '{out}'; run their tasks again before the merge")
    ordered = [chosen[p] for p in sorted(chosen)]
    shards = [s for part in ordered for s in part.shards]
    if not shards:
        raise PackError(f"nothing to merge in '{out}': the partitions hold no record")
    for info in shards:
        _check_part(out, info, verify=verify)
    names = [f"{prefix}-{n:05d}-of-{len(shards):05d}{spec.SHARD_SUFFIX}"
             for n in range(len(shards))]
    present = set(files.listdir(out))
    for name in [*names, spec.MANIFEST_NAME]:
        if name in present:
            raise PackError(f"'{files.join(out, name)}' is in the way of the merge; "
                            "merge into an empty folder")
    _save_journal(out, [n for name in names for n in _shard_files(name)])
    final = []
    for info, name in zip(shards, names):
        _move_shard(files.join(out, info.path), files.join(out, name))
        final.append(replace(info, path=name))
    from shardfeed.tools.pack.output import write_manifest

    labels = {p.label_key for p in ordered if p.label_key}
    label_key = ordered[0].label_key if len(labels) == 1 else None
    more = {"pack_files": [n for name in names for n in _shard_files(name)],
            "partitions": len(ordered), **(extra or {})}
    path = write_manifest(out, final, mode="embedded", root=None, label_key=label_key,
                          vocabularies={}, group_key=None, order_key=None, group_ids=None,
                          order_keys=None, extra=more)
    remove_parts(out)
    return path


def _journal_path(out: str) -> str:
    return files.join(out, PARTS_FOLDER, spec.MERGE_JOURNAL_NAME)


def _save_journal(out: str, names: Sequence[str]) -> None:
    """Save the names the merge is about to give files in ``out`` (before the first rename)."""
    text = json.dumps({"shardfeed_merge": 1, "files": list(names)}, indent=0) + "\n"
    files.write_bytes_atomic(_journal_path(out), text.encode("utf-8"))


def _journal_names(out: str, data: bytes) -> list[str]:
    """The file names a merge journal lists: plain names of shards and their indexes only
    (never a path out of ``out``, never a manifest or another file of the folder)."""
    where = _journal_path(out)
    try:
        document = json.loads(data)
        names = document["files"] if isinstance(document, dict) else None
    except (ValueError, KeyError):
        names = None
    suffixes = (spec.SHARD_SUFFIX, spec.TEXT_INDEX_SUFFIX, spec.BINARY_INDEX_SUFFIX)
    if not isinstance(names, list) or not all(
            isinstance(n, str) and n.endswith(suffixes) and _plain_name(n) for n in names):
        raise PackError(f"cannot read the merge journal '{where}' (not a list of shard "
                        "names); remove the folder's shards and its parts folder by hand, or "
                        "choose an empty folder")
    return names


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def clear_unfinished(output: str | os.PathLike[str]) -> list[str]:
    """Remove what a pack in parts that stopped mid-merge left in ``output``; return the
    names of the files removed (besides the parts folder).

    With the merge journal and no manifest, the files the journal names (the shards already
    renamed, their indexes) are removed, then the parts folder, the journal last: killed
    again meanwhile, the next call goes on. Refused (PackError, nothing removed) when the
    folder holds other files too. With a manifest, the merge committed and only the parts
    folder was left: it is removed. Without a journal, nothing is done (a parts folder of
    tasks killed before the merge is removed by :func:`remove_parts`).
    """
    out = os.fspath(output)
    if files.is_remote(out):
        out = out.rstrip("/")
    data = files.read_if_exists(_journal_path(out))
    if data is None:
        return []
    entries = files.listdir(out)
    if spec.MANIFEST_NAME in entries:
        remove_parts(out)
        return []
    names = _journal_names(out, data)
    owned = set(names)
    others = [e for e in entries if e != PARTS_FOLDER and e not in owned]
    if others:
        shown = ", ".join(f"'{n}'" for n in others[:5]) + (", ..." if len(others) > 5 else "")
        raise PackError(
            f"output folder '{out}' holds the shards of a pack whose merge did not finish "
            f"(named in '{_journal_path(out)}') and {len(others)} other entr"
            f"{'y' if len(others) == 1 else 'ies'} ({shown}); move those elsewhere and run "
            "the pack again (it removes what the merge left), or choose an empty folder")
    removed = [n for n in names if n in entries]
    for name in sorted(removed, key=lambda n: not n.endswith(spec.SHARD_SUFFIX)):
        files.remove(files.join(out, name), missing_ok=True)  # a shard before its indexes
    remove_parts(out)
    log.warning("'%s' held a pack whose merge did not finish: removed its %d files and its "
                "parts folder", out, len(removed))
    return removed


def _choose(partials: Sequence[Partial]) -> dict[int, Partial]:
    chosen: dict[int, Partial] = {}
    for part in sorted(partials, key=lambda p: (p.partition, p.attempt)):
        chosen.setdefault(part.partition, part)
    return chosen


def _check_part(out: str, info: ShardInfo, *, verify: bool) -> None:
    path = files.join(out, info.path)
    if not files.exists(path):
        raise PackError(f"the part '{path}' a partial names is missing; run its task again")
    size = files.size(path)
    if size != info.bytes:
        raise PackError(f"the part '{path}' holds {size} bytes, its partial says {info.bytes}; "
                        "it changed after its task finished: run that task again")
    if verify and info.crc32c is not None and _crc32c(path) != info.crc32c:
        raise PackError(f"the part '{path}' fails its CRC32C check; run its task again")


def _crc32c(path: str) -> int:
    """CRC32C of the whole file or object at ``path``, read in blocks."""
    if not files.is_remote(path):
        from shardfeed.tools.pack.kept import file_crc32c

        return file_crc32c(path)
    import google_crc32c

    from shardfeed.storage import open_source

    source = open_source(path)
    try:
        crc, at, total = 0, 0, source.size()
        while at < total:
            block = source.read(at, min(_CRC_BLOCK, total - at))
            if not block:
                break
            crc = int(google_crc32c.extend(crc, block))
            at += len(block)
    finally:
        source.close()
    return crc


_CRC_BLOCK = 8 << 20


def _shard_files(name: str) -> list[str]:
    return [name, spec.text_index_path(name), spec.binary_index_path(name)]


def _move_shard(src: str, dst: str) -> None:
    """Rename a shard and its indexes (indexes first: a shard never stands without them)."""
    for a, b in list(zip(_shard_files(src), _shard_files(dst)))[::-1]:
        if files.exists(a):
            files.rename(a, b)


__all__ = ["PARTS_FOLDER", "PartSizes", "Partial", "clear_unfinished", "merge_partitions",
           "remove_parts", "write_partition"]
