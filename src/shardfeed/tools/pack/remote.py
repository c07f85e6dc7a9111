"""``pack`` into object storage: build shards in a local staging folder, upload as they complete.

::

    local staging (temp)            bucket (s3://bucket/ds/)
    .shardfeed-pack.json            --> .shardfeed-pack.json               0. the plan first
    shard-00000-of-00004.tfrecord   --> shard-00000-of-00004.tfrecord      1. the shard
                      .idx, .idx.npy    --> .idx, .idx.npy                 2. its indexes
    ... every shard, as soon as it is complete and indexed ...
    skipped.csv, groups.npy, ...    --> skipped.csv, groups.npy, ...       3. sidecars
    shardfeed.json                  --> shardfeed.json                     4. the manifest, last
                                        .shardfeed-pack.json removed       5. done

Every object is written with :func:`shardfeed.storage.files.upload_file_atomic` (one PUT, or
a multipart upload that becomes visible only when complete), so an object under its final
name is always whole; an index is there only if its shard is; the manifest only when the
whole dataset is. ``Dataset(url)`` opens the manifest, so an interrupted upload never reads
as a complete dataset. Resuming is for local outputs: an interrupted remote pack is re-run
with ``overwrite=True``.

The plan file goes up before the first shard and is removed after the manifest, so the
prefix always records what pack wrote there: ``overwrite`` removes exactly that (after
checking, at the first shard, that no object it did not write is in the way), and leaves
every other object (see :mod:`shardfeed.tools.pack.ledger`).

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
from shardfeed.tools.pack.ledger import (
    PLAN_NAME,
    SKIPPED_NAME,
    Ledger,
    ledger_bytes,
    manifest_files,
    owned_files,
    ownership,
    parse_ledger,
    refuse_in_the_way,
)
from shardfeed.tools.pack.output import PackResult, count

log = logging.getLogger(__name__)

SIDECARS = (SKIPPED_NAME, spec.GROUPS_NAME, spec.ORDER_NAME)


class RemoteOutput:
    """A pack's remote output folder ``url`` and its local staging folder (a temp folder).

    ``staging`` is where pack writes; :meth:`shard_done` uploads one complete shard and its
    indexes (before the first, the plan file, after removing what an earlier pack wrote
    there with ``overwrite``); :meth:`finish` uploads the sidecars and the manifest last and
    removes the plan file; :meth:`close` removes the staging folder (idempotent).
    """

    def __init__(self, url: str, *, overwrite: bool, staging_dir: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._entries = self._existing()
        if self._entries and not overwrite:
            raise PackError(
                f"output '{self.url}' is not empty ({count(len(self._entries), 'object')}, "
                f"e.g. {self._entries[0]!r}); pass --overwrite (overwrite=True) to replace "
                "what pack wrote there, or choose an empty prefix"
            )
        self._manifest = self._read(spec.MANIFEST_NAME)
        self._ledger: Ledger | None = None
        data = self._read(PLAN_NAME)
        if data is not None:
            try:
                self._ledger = parse_ledger(data, where=files.join(self.url, PLAN_NAME))
            except PackError:
                self._ledger = None  # only the plan file itself is known to be pack's
        self._temp = tempfile.mkdtemp(prefix="shardfeed-pack-", dir=staging_dir)
        self.staging = os.path.join(self._temp, "out")
        self._started = False
        self._kept_first = False
        self.uploaded: list[str] = []

    def _read(self, name: str) -> bytes | None:
        if name not in self._entries:
            return None
        return files.read_if_exists(files.join(self.url, name))

    def _start(self) -> None:
        """Before the first upload: refuse to write over objects no pack wrote, record the
        plan (with what an earlier pack wrote) remotely, then remove the earlier pack's."""
        plan_path = os.path.join(self.staging, PLAN_NAME)
        with open(plan_path, "rb") as f:
            ledger = parse_ledger(f.read(), where=plan_path)
        found = ownership(self._entries, manifest=self._manifest, ledger=self._ledger,
                          planned=ledger.files)
        refuse_in_the_way(self.url, found)
        listed = [*manifest_files(self._manifest),
                  *(self._ledger.files if self._ledger is not None else ())]
        gone = owned_files(found.owned, listed)
        files.write_bytes_atomic(files.join(self.url, PLAN_NAME),
                                 ledger_bytes(ledger.plan, [*ledger.files, *found.owned, *gone]))
        # the manifest goes first: from then on the prefix no longer reads as a dataset
        for name in sorted(gone, key=lambda n: n != spec.MANIFEST_NAME):
            if name != PLAN_NAME:
                files.remove(files.join(self.url, name), missing_ok=True)
        if found.others:
            shown = ", ".join(found.others[:5]) + (", ..." if len(found.others) > 5 else "")
            log.warning("output '%s' keeps %s pack did not write (%s): they stay beside the "
                        "new dataset", self.url, count(len(found.others), "object"), shown)
        self._started = True

    def _existing(self) -> list[str]:
        if not files.exists(self.url):
            return []
        return files.listdir(self.url)

    def _upload(self, name: str) -> None:
        files.upload_file_atomic(os.path.join(self.staging, name), files.join(self.url, name))
        self.uploaded.append(name)

    def shard_done(self, path: str) -> None:
        """Upload the complete shard at ``path`` (in ``staging``), then its two indexes."""
        if not self._started:
            self._start()
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
        files.remove(files.join(self.url, PLAN_NAME), missing_ok=True)
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
