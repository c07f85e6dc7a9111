"""``pack`` into object storage: build shards in a local staging folder, upload as they complete.

::

    local staging (temp)            bucket (s3://bucket/ds/)
    shard-00000-of-00004.tfrecord   --> shard-00000-of-00004.tfrecord      1. the shard
                      .idx, .idx.npy    --> .idx, .idx.npy                 2. its indexes
    ... every shard, as soon as it is complete and indexed ...
    skipped.csv, groups.npy, ...    --> skipped.csv, groups.npy, ...       3. sidecars
    shardfeed.json                  --> shardfeed.json                     4. the manifest, last

Every object is written with :func:`shardfeed.storage.files.upload_file_atomic` (one PUT, or
a multipart upload that becomes visible only when complete), so an object under its final
name is always whole; an index is there only if its shard is; the manifest only when the
whole dataset is. ``Dataset(url)`` opens the manifest, so an interrupted upload never reads
as a complete dataset. Resuming is for local outputs: an interrupted remote pack is re-run
with ``overwrite=True``.

Determinism: the uploaded bytes are those a local pack writes. Memory: none beyond the pack's.
Local disk: the first shard (the schema is read from it at the end) and the shard being
written; other shards are deleted locally once uploaded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Callable

from shardfeed.errors import PackError
from shardfeed.format import spec
from shardfeed.storage import files
from shardfeed.tools.packoutput import PLAN_NAME, SKIPPED_NAME, PackResult, count

log = logging.getLogger(__name__)

SIDECARS = (SKIPPED_NAME, spec.GROUPS_NAME, spec.ORDER_NAME)


def _owned(name: str) -> bool:
    return (
        name in (PLAN_NAME, spec.MANIFEST_NAME, *SIDECARS)
        or name.endswith((spec.SHARD_SUFFIX, spec.TEXT_INDEX_SUFFIX, spec.BINARY_INDEX_SUFFIX,
                          spec.TEMP_SUFFIX))
    )


class RemoteOutput:
    """A pack's remote output folder ``url`` and its local staging folder (a temp folder).

    ``staging`` is where pack writes; :meth:`shard_done` uploads one complete shard and its
    indexes; :meth:`finish` uploads the sidecars and the manifest last; :meth:`close` removes
    the staging folder (idempotent).
    """

    def __init__(self, url: str, *, overwrite: bool, staging_dir: str | None = None) -> None:
        self.url = url.rstrip("/")
        existing = self._existing()
        owned = [n for n in existing if _owned(n)]
        if existing and not overwrite:
            raise PackError(
                f"output '{self.url}' is not empty ({count(len(existing), 'object')}, e.g. "
                f"{existing[0]!r}); pass --overwrite (overwrite=True) to replace what pack "
                "wrote there, or choose an empty prefix"
            )
        if overwrite:
            # the manifest goes first: from then on the prefix no longer reads as a dataset
            for name in sorted(owned, key=lambda n: n != spec.MANIFEST_NAME):
                files.remove(files.join(self.url, name), missing_ok=True)
            others = [n for n in existing if not _owned(n)]
            if others:
                log.warning("output '%s' keeps %s pack did not write (%s)", self.url,
                            count(len(others), "object"), ", ".join(others[:3]))
        self._temp = tempfile.mkdtemp(prefix="shardfeed-pack-", dir=staging_dir)
        self.staging = os.path.join(self._temp, "out")
        self._kept_first = False
        self.uploaded: list[str] = []

    def _existing(self) -> list[str]:
        if not files.exists(self.url):
            return []
        return files.listdir(self.url)

    def _upload(self, name: str) -> None:
        files.upload_file_atomic(os.path.join(self.staging, name), files.join(self.url, name))
        self.uploaded.append(name)

    def shard_done(self, path: str) -> None:
        """Upload the complete shard at ``path`` (in ``staging``), then its two indexes."""
        name = os.path.basename(path)
        self._upload(name)
        self._upload(name + spec.TEXT_INDEX_SUFFIX)
        self._upload(name + spec.BINARY_INDEX_SUFFIX)
        if not self._kept_first and os.path.getsize(path) > 0:
            self._kept_first = True  # the schema is sampled from the first non-empty shard
            return
        os.remove(path)

    def finish(self) -> str:
        """Upload the sidecars that exist, then the manifest; return the manifest's URL."""
        for name in SIDECARS:
            if os.path.exists(os.path.join(self.staging, name)):
                self._upload(name)
        self._upload(spec.MANIFEST_NAME)
        return files.join(self.url, spec.MANIFEST_NAME)

    def close(self) -> None:
        shutil.rmtree(self._temp, ignore_errors=True)


def pack_to_url(
    run: Callable[[str, Callable[[str], None]], PackResult],
    url: str,
    *,
    resume: bool,
    overwrite: bool,
) -> PackResult:
    """Run a local pack ``run(staging_folder, on_shard)`` and upload its output to ``url``."""
    if resume:
        raise ValueError(
            f"resume works for local outputs only, got the URL {url!r}; re-run with "
            "overwrite=True (--overwrite), or pack locally and upload"
        )
    output = RemoteOutput(url, overwrite=overwrite)
    try:
        result = run(output.staging, output.shard_done)
        manifest = output.finish()
    finally:
        output.close()
    log.info("uploaded %s to '%s'", count(result.shards, "shard"), output.url)
    skipped = files.join(output.url, SKIPPED_NAME) if result.skipped_list else None
    return dataclasses.replace(result, output=output.url, manifest=manifest,
                               skipped_list=skipped)
