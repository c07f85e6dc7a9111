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
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from shardfeed.errors import ShardfeedError
from shardfeed.format.schema import ImageInfo
from shardfeed.tools import packfiles
from shardfeed.tools.verify_report import Problem, ShardCheck, VerifyReport
from shardfeed.tools.verify_shard import Expected, ShardJob, check_shard

# The kinds of problem (BAD_DATA_CRC, TRUNCATED, ...) are in shardfeed.tools.verify_report.
__all__ = ["Problem", "ShardCheck", "VerifyReport", "verify"]


def _expected_from_manifest(
    manifest_path: str,
) -> tuple[list[str], list[Expected], str | None, ImageInfo | None, ImageInfo | None, bool]:
    """Shard paths, what the manifest says of each, the root, image key, mask key, and
    whether the records reference image files."""
    from shardfeed.format.manifest import Manifest

    manifest = Manifest.load(manifest_path)
    base = os.path.dirname(os.path.abspath(manifest_path))
    paths, expected = [], []
    for shard in manifest.shards:
        p = shard.path if os.path.isabs(shard.path) or "://" in shard.path else os.path.join(base, shard.path)
        paths.append(p)
        expected.append(Expected(records=shard.records, size=shard.bytes, checksum=shard.crc32c))
    root = manifest.root
    if root is not None and not os.path.isabs(root) and "://" not in root:
        root = os.path.join(base, root)
    schema = manifest.schema
    image = schema.image if schema is not None else None
    mask = schema.mask if schema is not None else None
    return paths, expected, root, image, mask, manifest.mode == "referenced"


def _sampled_slots(paths: Sequence[str]) -> tuple[ImageInfo | None, ImageInfo | None]:
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
        expected = [Expected()] * len(paths)
        mroot = None
        if decode:
            image, mask = _sampled_slots(paths)
    use_root = os.fspath(root) if root is not None else mroot
    check_paths = referenced or root is not None
    jobs = [
        ShardJob(p, e, decode, use_root, check_paths, image, mask) for p, e in zip(paths, expected)
    ]
    total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
    from tqdm import tqdm

    lock = threading.Lock()
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        if workers == 1 or len(jobs) == 1:
            checks = [check_shard(j, advance) for j in jobs]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                checks = list(pool.map(lambda j: check_shard(j, advance), jobs))
    problems = tuple(p for c in checks for p in c.problems)
    return VerifyReport(shards=tuple(checks), manifest=manifest_path, decode=decode,
                        problems=problems)
