"""Checking the shards a pack keeps instead of writing them: is each one what was written?

``resume`` keeps the complete shards of an interrupted pack; between the two runs a shard
may have been damaged (a flipped bit, a copy cut short, a file replaced). A kept shard is
checked against what its writer recorded in the plan file (size and whole-file CRC32C, see
:mod:`shardfeed.tools.pack.ledger`), and its two indexes against each other, the plan's
record count and the file size. A shard the ledger has no line for (the pack stopped right
after renaming it) has every record's own CRCs checked instead. ``resume`` on a finished
dataset checks its shards against the manifest's sizes and checksums the same way.

Cost: one sequential read of each kept shard (CRC32C runs at several GB/s), far less than
packing it; a progress bar in bytes. Memory: one 8 MiB block and the shard's offsets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from shardfeed.errors import PackError, ShardfeedError
from shardfeed.format import spec
from shardfeed.format.manifest import Manifest, ShardInfo
from shardfeed.tools.pack.plan import PackPlan, ShardPlan

log = logging.getLogger(__name__)

_BLOCK_BYTES = 8 << 20


def file_crc32c(path: str, advance: Callable[[int], object] = lambda n: None) -> int:
    """CRC32C of the whole file at ``path``, read in 8 MiB blocks."""
    import google_crc32c

    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_BLOCK_BYTES):
            crc = int(google_crc32c.extend(crc, chunk))
            advance(len(chunk))
    return crc


def _problem(path: str, records: int, recorded: ShardInfo | None,
             advance: Callable[[int], object]) -> tuple[ShardInfo | None, str]:
    """(the shard's ShardInfo, "") when it is whole, else (None, what is wrong)."""
    from shardfeed.format.framing import scan
    from shardfeed.format.index import load_binary_index, read_text_index
    from shardfeed.format.records_hash import hash_of_shard

    name = os.path.basename(path)
    size = os.path.getsize(path)
    offsets = load_binary_index(spec.binary_index_path(path), mmap=False)
    if not np.array_equal(offsets, read_text_index(spec.text_index_path(path))):
        return None, "has indexes that disagree with each other"
    if offsets.size - 1 != records or int(offsets[-1]) != size:
        return None, (f"holds {offsets.size - 1} records in {size:,} bytes by its index, but "
                      f"{records} were planned")
    if recorded is None:
        scanned = scan(path, verify_data=True, progress=advance)
        if not np.array_equal(scanned, offsets):
            return None, "does not match its index"
        return ShardInfo(path=name, records=records, bytes=size, crc32c=file_crc32c(path),
                         records_hash=hash_of_shard(path, offsets)), ""
    if recorded.bytes != size or recorded.records != records:
        return None, (f"is {size:,} bytes, but {recorded.bytes:,} were written")
    crc = file_crc32c(path, advance)
    if crc != recorded.crc32c:
        return None, (f"changed since it was written (CRC32C {recorded.crc32c:#010x} "
                      f"recorded, {crc:#010x} now)")
    return ShardInfo(path=name, records=records, bytes=size, crc32c=crc,
                     records_hash=hash_of_shard(path, offsets)), ""


def check_kept(
    out: str, candidates: Sequence[ShardPlan], done: Mapping[str, ShardInfo], *,
    progress: bool = False,
) -> dict[int, ShardInfo]:
    """The candidates (complete shards of the plan found in ``out``) that are exactly what
    was written (index -> ShardInfo); each other one is named in a warning, to be written
    again. ``done`` holds what the writer recorded (name -> ShardInfo with the CRC32C)."""
    from tqdm import tqdm

    kept: dict[int, ShardInfo] = {}
    paths = [os.path.join(out, s.name) for s in candidates]
    total = sum(os.path.getsize(p) for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc="check kept shards",
              disable=not progress or not candidates) as bar:
        for shard, path in zip(candidates, paths):
            recorded = done.get(shard.name)
            try:
                info, problem = _problem(path, shard.records, recorded, bar.update)
            except (ShardfeedError, OSError, ValueError) as exc:
                info, problem = None, f"cannot be read back ({exc})"
            if info is not None:
                kept[shard.index] = info
                if recorded is None:
                    log.info("shard '%s' had no checksum recorded; its records' CRCs were "
                             "checked", path)
                continue
            log.warning("shard '%s' kept from the interrupted pack %s; writing it again",
                        path, problem)
    return kept


def check_complete(out: str, shards: Sequence[ShardInfo], *, progress: bool = False) -> None:
    """Check every shard of a finished dataset in ``out`` against its manifest entry (size,
    CRC32C, indexes); raise PackError naming the first that does not match."""
    from tqdm import tqdm

    paths = [os.path.join(out, os.path.basename(s.path)) for s in shards]
    try:
        total = sum(os.path.getsize(p) for p in paths)
    except OSError as exc:
        raise PackError(
            f"output folder '{out}' holds a finished dataset with a shard missing ({exc}); "
            "pack it again with --overwrite"
        ) from None
    with tqdm(total=total, unit="B", unit_scale=True, desc="check shards",
              disable=not progress) as bar:
        for info, path in zip(shards, paths):
            recorded = info if info.crc32c is not None else None
            try:
                _, problem = _problem(path, info.records, recorded, bar.update)
            except (ShardfeedError, OSError, ValueError) as exc:
                problem = f"cannot be read back ({exc})"
            if problem:
                raise PackError(
                    f"output folder '{out}' holds a finished dataset, but its shard '{path}' "
                    f"{problem.replace('since it was written', 'since it was packed')}; "
                    "pack it again with --overwrite (`shardfeed verify` shows every damaged "
                    "record)"
                )


def already_complete(out: str, plan: PackPlan, *, mode: str, progress: bool) -> Manifest:
    """``resume`` where the pack finished: check that the dataset in ``out`` is what a pack
    of ``plan`` in ``mode`` writes (a pack's manifest, the same mode, shard names and record
    counts) and that every shard is whole (size, CRC32C and indexes against the manifest);
    return its Manifest, changing nothing. PackError otherwise."""
    from shardfeed.tools.pack.ledger import manifest_files

    path = os.path.join(out, spec.MANIFEST_NAME)
    with open(path, "rb") as f:
        ours = bool(manifest_files(f.read()))
    if not ours:
        raise PackError(
            f"output folder '{out}' holds a finished dataset that pack cannot match to these "
            "inputs (its manifest was written by `shardfeed index` or an earlier version of "
            "pack); there is nothing to resume: pass --overwrite to pack it again"
        )
    manifest = Manifest.load(path)
    stored = "embedded" if mode == "raw" else mode  # raw pixels live inside the records
    if manifest.mode != stored or [(s.name, s.records) for s in plan.shards] != [
        (os.path.basename(s.path), s.records) for s in manifest.shards
    ]:
        raise PackError(
            f"output folder '{out}' holds a finished dataset packed from other inputs or "
            "options (its shards or their record counts differ); there is nothing to resume: "
            "pass --overwrite to pack it again, or choose another folder"
        )
    check_complete(out, manifest.shards, progress=progress)
    log.info("'%s' is already complete and its shards match the manifest; nothing to do", out)
    return manifest
