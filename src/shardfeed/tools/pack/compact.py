"""``compact``: the small shards that appends leave, merged, as the dataset's next version,
with the same records in the same order.

::

    version k:    shard-00000 (64 MB) | v2/shard-00000 (1 MB) | v3/shard-00000 (1 MB) | ...
    version k+1:  shard-00000 (64 MB) | v{k+1}/shard-00000 (the small ones, in order) | ...

Runs of consecutive shards smaller than half the target size are merged, in order, into
shards of at most the target (a shard of half the target or more stays as it is). The new
shards hold the same payloads byte for byte (read through the Dataset, CRC-checked, and
written again with their framing), so the records hash, and with it the dataset's
fingerprint, is unchanged: every loader state of version k restores on version k+1 and
gives the same stream. The version is committed as an append's is (its manifest created
exclusively, then made the newest); earlier versions and their shards stay, readable. On
object storage each merged shard is built in a local staging folder and uploaded (the shard
before its indexes) into a folder of its own.

Determinism: the new shards' bytes are a function of the records and the target size.
State: the files above. Memory: one chunk of payloads (``CHUNK_RECORDS``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence

from shardfeed.errors import PackError
from shardfeed.format import _fileio
from shardfeed.format import spec as S
from shardfeed.format.manifest import DATASET_VERSION_KEY, Manifest, ShardInfo, version_file
from shardfeed.storage import files, is_remote
from shardfeed.tools.pack.append import commit_version, reserve_version
from shardfeed.tools.pack.output import PackResult

CHUNK_RECORDS = 1024
"""Payloads read and written at a time."""


def plan_runs(shards: Sequence[ShardInfo], target: int, *, by_records: bool) -> list[range]:
    """The runs of consecutive shards (as ranges of their positions) to merge: shards under
    half of ``target`` (bytes, or records with ``by_records``), gathered in order while the
    run stays within ``target``; runs of one shard are left out (nothing to merge)."""
    runs: list[range] = []
    start, size = 0, 0

    def close(end: int) -> None:
        if end - start >= 2:
            runs.append(range(start, end))

    for k, shard in enumerate(shards):
        amount = shard.records if by_records else shard.bytes
        if 2 * amount >= target:  # large enough: it stands alone
            close(k)
            start, size = k + 1, 0
        elif size + amount > target:
            close(k)
            start, size = k, amount
        else:
            size += amount
    close(len(shards))
    return runs


def compact(output: str | os.PathLike[str], *, target: int, by_records: bool = False,
            prefix: str = "shard", on_shard: Callable[[str], object] | None = None
            ) -> PackResult:
    """Merge the newest version's small shards of the dataset in ``output`` (a folder or an
    object-storage URL) into its next version (see the module docstring); ``target``: the
    merged shards' size (bytes, or records with ``by_records``). A dataset with nothing to
    merge is left as it is (``PackResult.already_complete``)."""
    out = os.fspath(output)
    if not is_remote(out):
        out = os.path.abspath(out)
    newest = files.join(out, S.MANIFEST_NAME)
    if not _fileio.exists(newest):
        raise PackError(f"there is no dataset to compact in '{out}' (no {S.MANIFEST_NAME})")
    base_bytes = _fileio.read_bytes(newest, max_bytes=S.MAX_MANIFEST_BYTES)
    base = Manifest.load(newest, data=base_bytes)
    if any(s.records_hash is None for s in base.shards):
        raise PackError(f"the shards of '{out}' have no records hash (they were indexed, not "
                        "packed by shardfeed): compact could not keep the dataset's fingerprint, "
                        "so loader states would not restore; pack the records again instead")
    runs = plan_runs(base.shards, target, by_records=by_records)
    if not runs:
        return _result(out, base, already=True)
    version = base.dataset_version + 1
    name = reserve_version(out, version)
    try:
        with tempfile.TemporaryDirectory(prefix="shardfeed-compact-") as staging:
            return _write(out, base, base_bytes, runs, name=name, version=version,
                          prefix=prefix, on_shard=on_shard, staging=staging)
    except BaseException:  # nothing committed: the new version's folder goes
        if is_remote(out):
            files.remove_tree(files.join(out, name))
        else:
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
        raise


def _write(out: str, base: Manifest, base_bytes: bytes, runs: list[range], *, name: str,
           version: int, prefix: str, on_shard: Callable[[str], object] | None,
           staging: str) -> PackResult:
    """Write the merged shards into ``out/name`` (on object storage: each built in the local
    ``staging`` folder, then uploaded with its indexes, the shard first) and commit version
    ``version``."""
    from shardfeed.dataset import Dataset
    from shardfeed.dataset.fingerprint import manifest_fingerprint
    from shardfeed.format.writer import ShardWriter

    starts = [0]
    for shard in base.shards:
        starts.append(starts[-1] + shard.records)
    merged: dict[int, ShardInfo] = {}  # first shard of a run -> the run's new shard
    with Dataset(out, version=base.dataset_version) as ds:
        for number, run in enumerate(runs):
            file = f"{prefix}-{number:05d}.tfrecord"
            remote = is_remote(out)
            path = os.path.join(staging if remote else os.path.join(out, name), file)
            with ShardWriter(path, name=f"{name}/{file}") as writer:
                for lo in range(starts[run.start], starts[run.stop], CHUNK_RECORDS):
                    hi = min(lo + CHUNK_RECORDS, starts[run.stop])
                    for payload in ds.read_payloads(range(lo, hi)):
                        writer.write(payload)
                merged[run.start] = writer.close()
            if remote:
                for ext in ("", ".idx", ".idx.npy"):  # the shard before its indexes
                    files.upload_file_atomic(path + ext, files.join(out, name, file + ext))
                    os.remove(path + ext)
            if on_shard is not None:
                on_shard(files.join(out, name, file))
    shards: list[ShardInfo] = []
    skip: set[int] = {k for run in runs for k in run if k != run.start}
    for k, shard in enumerate(base.shards):
        if k in merged:
            shards.append(merged[k])
        elif k not in skip:
            shards.append(shard)
    if manifest_fingerprint(shards) != manifest_fingerprint(base.shards):
        raise PackError(f"compacting '{out}' would change its records (the records hash of the "
                        f"merged shards differs); nothing was committed, '{name}/' can be removed")
    made = [f"{name}/{os.path.basename(s.path)}{ext}" for s in merged.values()
            for ext in ("", ".idx", ".idx.npy")]
    written = [*base.extra.get("pack_files", []), *made, version_file(version - 1),
               version_file(version)]
    extra = {**base.extra, DATASET_VERSION_KEY: version, "pack_files": written}
    compacted = dataclasses.replace(base, shards=shards, extra=extra)
    commit_version(out, compacted, old=version - 1, new=version, name=name, base=base_bytes)
    return _result(out, compacted, already=False)


def _result(out: str, manifest: Manifest, *, already: bool) -> PackResult:
    return PackResult(output=out, manifest=files.join(out, S.MANIFEST_NAME),
                      shards=len(manifest.shards), records=manifest.num_records,
                      bytes=sum(s.bytes for s in manifest.shards), kept_shards=0,
                      already_complete=already, version=manifest.dataset_version)


__all__ = ["compact", "plan_runs"]
