"""The last phase of ``pack``: the list of what was not packed, the sidecars, the manifest.

::

    shards complete --> skipped.csv --> groups.npy, order.npy --> shardfeed.json --> plan removed

The manifest is the commit point: it is written last, atomically, and records the files the
pack wrote (``extra.pack_files``: what ``overwrite`` may remove, and how ``resume`` knows a
finished pack).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardfeed.format import spec
from shardfeed.tools.pack import output as packoutput
from shardfeed.tools.pack import time as packtime
from shardfeed.tools.pack.check import BadInput
from shardfeed.tools.pack.items import PackInput, PackItem
from shardfeed.tools.pack.ledger import SKIPPED_NAME
from shardfeed.tools.pack.output import PackResult
from shardfeed.tools.pack.plan import PackPlan
from shardfeed.tools.pack.record import Mode

log = logging.getLogger("shardfeed.tools.pack")


def commit_names(data: PackInput, bad: Sequence[BadInput]) -> list[str]:
    """The files written after the shards: the skipped list, sidecars, the manifest."""
    names = [SKIPPED_NAME] if bad or data.ignored else []
    names += [spec.GROUPS_NAME] if data.group_key is not None else []
    names += [spec.ORDER_NAME] if data.order_key is not None else []
    return [*names, spec.MANIFEST_NAME]


def complete_result(
    out: str, manifest: Any, data: PackInput, bad: Sequence[BadInput]
) -> PackResult:
    skipped = os.path.join(out, SKIPPED_NAME)
    return PackResult(
        output=out, manifest=os.path.join(out, spec.MANIFEST_NAME),
        shards=len(manifest.shards), records=manifest.num_records,
        bytes=sum(s.bytes for s in manifest.shards), kept_shards=len(manifest.shards),
        skipped=tuple(bad), skipped_list=skipped if os.path.isfile(skipped) else None,
        order_unit=data.order_unit, ignored=tuple(i.path for i in data.ignored),
        already_complete=True,
    )


def commit(
    out: str, items: Sequence[PackItem], plan: PackPlan, infos: dict[int, Any],
    data: PackInput, *, mode: Mode, bad: Sequence[BadInput], kept: int,
    planned: Sequence[str],
) -> PackResult:
    """Write the list of what was not packed, the sidecars and the manifest (last)."""
    group_ids = order_keys = None
    if data.group_key is not None:
        group_ids = np.array([items[i].group for i in plan.order], dtype=np.int64)
    if data.order_key is not None:
        order_keys = np.array(
            [packtime.nanos_to_seconds(int(items[i].order_ns or 0)) for i in plan.order],
            dtype=np.float64,
        )
    skipped_list = packoutput.write_skipped(
        out, [(p.path, p.line, p.problem) for p in bad]
        + [(i.path, None, i.reason) for i in data.ignored],
    )
    # what this pack wrote, so that --overwrite removes exactly that (names only: the
    # manifest's bytes stay a function of the inputs' contents and the options)
    extra: dict[str, Any] = {"pack_files": [n for n in planned if n != spec.MANIFEST_NAME]}
    if data.order_key is not None:
        extra["order_key_unit"] = packtime.STORED_UNIT
        extra["order_column_unit"] = data.order_unit
    manifest = packoutput.write_manifest(
        out,
        [infos[s.index] for s in plan.shards],
        mode=mode,
        root=data.root if mode == "referenced" else None,
        label_key=data.label_key,
        vocabularies=dict(data.vocabularies),
        group_key=data.group_key,
        order_key=data.order_key,
        group_ids=group_ids,
        order_keys=order_keys,
        group_names=data.group_names,
        extra=extra,
    )
    packoutput.remove_plan(out)
    total_bytes = sum(int(infos[s.index].bytes) for s in plan.shards)
    if data.ignored:
        first = data.ignored[0]
        log.warning(
            "%s of '%s' not packed (e.g. '%s': %s); listed in '%s'",
            packoutput.count(len(data.ignored), "file"), data.where, first.path, first.reason,
            skipped_list,
        )
    log.info("packed %s into %s in '%s'", packoutput.count(len(items), "record"),
             packoutput.count(len(plan.shards), "shard"), out)
    return PackResult(
        output=out, manifest=manifest, shards=len(plan.shards), records=len(items),
        bytes=total_bytes, kept_shards=kept, skipped=tuple(bad), skipped_list=skipped_list,
        order_unit=data.order_unit, ignored=tuple(i.path for i in data.ignored),
    )
