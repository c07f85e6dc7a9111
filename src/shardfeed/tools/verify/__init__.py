"""Check a dataset: every record's framing and CRCs, optionally every image, and the manifest.

``verify(source)`` opens ``source`` the way ``Dataset`` does (the same resolution of folders,
manifests, globs and lists, local or on object storage, and the same refusal of an unfinished
pack), reads each shard through the same byte sources, walks it record by record and lists
each problem with its file, record index and byte offset: bad length CRC, bad data CRC,
truncated record, a record that is not a ``tf.train.Example``, an undecodable image or mask
(``decode=True``), a missing referenced file, a shard whose size, checksum or record count
differs from the manifest, an index file that does not match its shard. After a bad length
CRC the rest of the shard can only be checked where an index says where the records start;
otherwise the walk stops there.

Determinism: the report lists problems sorted by shard and offset, whatever ``workers``.
State: none. Memory: one read block (8 MiB) and one record per worker.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from shardfeed.dataset.opening import Resolved, referenced_root, resolve_sources
from shardfeed.errors import ShardfeedError
from shardfeed.format.schema import ImageInfo
from shardfeed.storage import is_remote
from shardfeed.tools.pack.workers import Runner, no_progress
from shardfeed.tools.verify.report import Problem, ShardCheck, VerifyReport
from shardfeed.tools.verify.shard import Expected, ShardJob, check_shard
from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS, check_max_pixels

# The kinds of problem (BAD_DATA_CRC, TRUNCATED, ...) are in shardfeed.tools.verify.report.
__all__ = ["Problem", "ShardCheck", "VerifyReport", "verify"]


def _sampled_slots(urls: Sequence[str]) -> tuple[ImageInfo | None, ImageInfo | None]:
    """Image and mask info inferred from the first records of the first readable file
    (files without a manifest); (None, None) when nothing can be read."""
    from shardfeed.format.example import decode_example
    from shardfeed.format.framing import scan, unframe
    from shardfeed.format.schema import infer_schema
    from shardfeed.storage import open_source

    for url in urls:
        try:
            offsets = scan(url)
            if offsets.size < 2:
                continue
            source = open_source(url)
            try:
                data = source.read(0, int(offsets[min(16, offsets.size - 1)]))
            finally:
                source.close()
            records = [
                decode_example(unframe(data[int(a):int(b)], path=url, record=i, offset=int(a)))
                for i, (a, b) in enumerate(itertools.pairwise(offsets[:17].tolist()))
            ]
            schema = infer_schema(records)
        except (ShardfeedError, OSError):
            continue
        return schema.image, schema.mask
    return None, None


def _total_bytes(urls: Sequence[str], expected: Sequence[Expected]) -> int | None:
    """Bytes to walk, for the progress bar: the manifest's sizes, else local file sizes;
    None (unknown) for files on object storage without a manifest."""
    if all(e.size is not None for e in expected):
        return sum(int(e.size or 0) for e in expected)
    if any(is_remote(u) for u in urls):
        return None
    return sum(os.path.getsize(u) for u in urls if os.path.isfile(u))


def _jobs(resolved: Resolved, *, decode: bool, root: str | os.PathLike[str] | None,
          allow_outside_paths: bool, image_info: ImageInfo | None = None,
          mask_info: ImageInfo | None = None) -> list[ShardJob]:
    """One job a shard, with what the manifest (if any) says of it, and where the caller
    says the image and mask are (over what the manifest or the records' names suggest)."""
    urls = list(resolved.urls)
    manifest = resolved.manifest
    image = mask = None
    referenced = False
    if manifest is not None:
        expected = [Expected(records=s.records, size=s.bytes, checksum=s.crc32c)
                    for s in manifest.shards]
        if manifest.schema is not None:
            image, mask = manifest.schema.image, manifest.schema.mask
        referenced = manifest.mode == "referenced"
    else:
        expected = [Expected()] * len(urls)
        if decode:
            image, mask = _sampled_slots(urls)
    # the caller's names, over the manifest's, unless they name the same feature (the
    # manifest then says how it is stored: raw, a path)
    if image_info is not None and (image is None or image.key != image_info.key):
        image = image_info
    if mask_info is not None and (mask is None or mask.key != mask_info.key):
        mask = mask_info
    use_root = referenced_root(resolved, root, allow_outside_paths=allow_outside_paths)
    check_paths = referenced or root is not None
    return [ShardJob(u, e, decode, use_root, check_paths, image, mask)
            for u, e in zip(urls, expected)]


def check_quietly(job: ShardJob) -> ShardCheck:
    """``check_shard`` without progress (for a runner that ships it to other processes)."""
    return check_shard(job, no_progress)


def verify(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    decode: bool = False,
    root: str | os.PathLike[str] | None = None,
    workers: int = 1,
    progress: bool = False,
    allow_outside_paths: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    run: Runner | None = None,
    image: ImageInfo | None = None,
    mask: ImageInfo | None = None,
) -> VerifyReport:
    """Check every record of a dataset; see the module docstring for what is checked.

    ``source``: anything ``Dataset`` opens, local or on object storage (``s3://``,
    ``memory://``, ...): a dataset folder or manifest (then sizes, checksums and record counts
    are checked against it), a folder of TFRecord files, a glob, or a list of files (also of
    folders and globs, as a command's several arguments give). A folder
    whose pack did not finish is refused with :class:`~shardfeed.errors.FormatError`, as
    ``Dataset`` refuses it. ``root``: where referenced images live (default: the manifest's
    root). ``workers`` shards are checked at once. ``max_pixels``: the most pixels an image
    may have, as the Loader's decode ops take it (a larger one is a bad record). Never raises
    for bad records or shards: every problem is in the report, also a referenced path that
    leads outside the root. A manifest naming shards or an image root outside the dataset
    raises :class:`~shardfeed.errors.UnsafePathError` unless ``allow_outside_paths`` (as
    ``Dataset`` does; see :mod:`shardfeed.storage.paths`).
    ``run(fn, shards) -> results``: how the shards' checks are spread (default: ``workers``
    threads here; :func:`shardfeed.tools.ray.ray_map`: a Ray task a shard, no progress bar).
    ``image``/``mask``: where the image and mask are in each record (e.g. TensorFlow's guide
    layout: ``ImageInfo("image_raw", "mixed")``, ``ImageInfo("mask_raw", "raw", "height",
    "width")``), over what the manifest's schema or the standard feature names say.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    check_max_pixels(max_pixels)
    resolved = resolve_sources(source, allow_outside_paths=allow_outside_paths)
    jobs = [replace(job, max_pixels=max_pixels) for job in
            _jobs(resolved, decode=decode, root=root, allow_outside_paths=allow_outside_paths,
                  image_info=image, mask_info=mask)]
    total = _total_bytes([j.path for j in jobs], [j.expected for j in jobs])
    from tqdm import tqdm

    lock = threading.Lock()
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        if run is not None:
            checks = list(run(check_quietly, jobs))
        elif workers == 1 or len(jobs) == 1:
            checks = [check_shard(j, advance) for j in jobs]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                checks = list(pool.map(lambda j: check_shard(j, advance), jobs))
    problems = tuple(p for c in checks for p in c.problems)
    return VerifyReport(shards=tuple(checks), manifest=resolved.manifest_url, decode=decode,
                        problems=problems)
