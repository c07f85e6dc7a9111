"""Patches' batch path: a slice's patches cut straight into the batch rows.

For :meth:`Patches.build_rows <shardfeed.pipeline.patches.Patches.build_rows>`: the slice's
images from the decoded-image cache, each asked for once for all its outputs; every crop
drawn in one call (:func:`~.patch_crops.patch_boxes`); the patches cut in one compiled pass
(:func:`~.patch_crops.cut_rows`); the records' other features stored a column at a time
(:func:`~.patch_crops.stacked_values`, each image's values laid out when it was decoded; or
:func:`~.patch_crops.stacked_features` where the images' features differ); then the
transform's batch form over the rows.

Determinism: the bytes of the sample path (tests compare them), whatever the threads.
State: none (the sampler's cache). Memory: the slice's images, held while it cuts.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from shardfeed.errors import SchemaError
from shardfeed.pipeline.batching import BatchBuffer
from shardfeed.pipeline.image_cache import ImageCache
from shardfeed.pipeline.patch_crops import (
    PatchOptions,
    cut_rows,
    patch_boxes,
    stacked_features,
    stacked_values,
)
from shardfeed.pipeline.samplers import (
    DATA_ERRORS,
    BatchFormFailed,
    EpochContext,
    Sample,
    SampleKey,
    Transform,
)
from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.sampling.patches import PatchSchedule
from shardfeed.transforms.decode.patches import DecodedImage

__all__ = ["PatchSampler", "build_patch_rows"]


class PatchSampler(Protocol):
    """What the batch path uses of :class:`~shardfeed.pipeline.patches.Patches`."""

    cache: ImageCache[DecodedImage] | None
    options: PatchOptions
    schedule: PatchSchedule

    def plan_units(self, ctx: EpochContext,
                   positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def read(self, records: Sequence[int]) -> list[Sample]: ...

    def read_uncached(self, ids: list[int]) -> dict[int, Sample]: ...

    def _load(self, rid: int, record: Sample | None) -> tuple[DecodedImage, int]: ...

    def _decoded(self, key: SampleKey, rid: int, record: Sample,
                 q: int | None = None) -> DecodedImage: ...

_PARTS = operator.attrgetter("image", "mask", "dims", "kinds", "values", "meta")


def build_patch_rows(patches: PatchSampler, ctx: EpochContext, positions: np.ndarray,
                     buffer: BatchBuffer, first_row: int,
                     transform: Transform | None = None) -> bool:
    """The outputs of ``positions`` written into rows ``first_row...`` of ``buffer`` a
    slice at a time: the images from the cache as the sample path
    (:meth:`~shardfeed.pipeline.patches.Patches.make_sample`) gets them, every crop drawn in
    one call (:func:`~.patch_crops.patch_boxes`), the patches cut straight into the batch
    rows, the other features stored a column at a time, then ``transform``'s batch form over
    the rows (each row's generator the one the sample path hands it): the bytes of the
    sample path. False (rows unspecified) where the slice is for that path: a patch or
    feature that does not fit the batch as it is. SchemaError where these rows are never for
    it (images with masks, ``transform`` without a batch form for them: the caller stops
    asking); :class:`BatchFormFailed` where the transform's batch form raised (a bug in it).
    Data errors propagate (the sample path then names or skips the record). Without a cache
    one image is held at a time, as on the sample path; with one, the slice's images (a
    cached one costs nothing more)."""
    field = next((f for f in buffer.layout.fields if f.name == "image"), None)
    if field is None or not field.is_array or field.squeeze or not len(positions):
        return False
    positions = np.asarray(positions, dtype=np.int64)
    q, units = patches.plan_units(ctx, positions)  # decodes start ahead
    records = units.tolist()
    unique = list(dict.fromkeys(records))  # the slice's images, in the order of first use
    n, k = len(positions), len(unique)
    out = buffer.arrays["image"][first_row : first_row + n]
    if patches.cache is None:
        read = dict(zip(unique, patches.read(unique)))
        # every output decodes an image of its own: one held at a time, as on the
        # sample path
        boxes = np.empty((n, 4), dtype=np.int64)
        full = np.empty((n, 2), dtype=np.int64)
        metas = []
        for row, (position, rid) in enumerate(zip(positions.tolist(), records)):
            decoded = patches._decoded(SampleKey(ctx.seed, ctx.epoch, position), rid,
                                       read[rid])
            if decoded.mask is not None:
                raise SchemaError("patches with masks are cut one by one")
            image = decoded.image
            box = patch_boxes(ctx.seed, ctx.epoch, positions[row : row + 1],
                              np.array(image.shape[:1], dtype=np.int64),
                              np.array(image.shape[1:2], dtype=np.int64), patches.options)
            if not cut_rows([image], box, out[row : row + 1], patches.options):
                return False
            boxes[row] = box[0]
            full[row] = decoded.full_hw
            metas.append(decoded.meta)
            del decoded, image
        columns = stacked_features(metas)
    else:
        # The slice's images from the cache, each asked for once for all its outputs:
        # at its first output (the clock then), expiring after its order position's last
        # output. In the order of the images' first outputs: in the order of their last,
        # slices decoded more images themselves, not ahead (90-107 against 57-69 in
        # 70,000-90,000 patches on 2 cores, in 8-second runs). The images are
        # held for the slice (a cached one costs nothing more, and at most one a refresh
        # the slice spans is evicted meanwhile); every crop drawn in one call, cut in one
        # pass.
        seed, epoch = ctx.seed, ctx.epoch
        _, last = patches.schedule.resident_spans(q)
        inverse: np.ndarray | None = None
        if k == n:  # an image an output (a block of N outputs): as asked, no spreading
            expires, first, uses = last.tolist(), positions.tolist(), None
        else:
            place = dict(zip(unique, range(k)))  # a record -> its place among them
            inverse = np.fromiter(map(place.__getitem__, records), dtype=np.intp, count=n)
            most = np.full(k, -1, dtype=np.int64)
            np.maximum.at(most, inverse, last)
            least = np.full(k, len(patches.schedule), dtype=np.int64)
            np.minimum.at(least, inverse, positions)
            expires, first = most.tolist(), least.tolist()
            uses = np.bincount(inverse, minlength=k).tolist()
        # the images neither cached nor being decoded are read now (their loads
        # below decode them); a cached one that is evicted meanwhile is read by its load
        read = patches.read_uncached(unique)
        load = patches._load
        decoded_of = patches.cache.get_many(
            unique, lambda j: functools.partial(load, unique[j], read.get(unique[j])),
            expires=list(zip(itertools.repeat(epoch), expires)),
            now=list(zip(itertools.repeat(epoch), first)), uses=uses)
        # what the slice needs of each image, in one pass (each image worked it out when it
        # was decoded: DecodedImage), not again for each of the tens of slices it serves
        images, masks, sizes, kinds, values, meta_of = zip(*map(_PARTS, decoded_of),
                                                           strict=True)
        del decoded_of
        if any(map(operator.is_not, masks, itertools.repeat(None))):
            raise SchemaError("patches with masks are cut one by one")
        dims = np.fromiter(itertools.chain.from_iterable(sizes), dtype=np.int64,
                           count=4 * k).reshape(k, 4)
        if kinds.count(kinds[0]) == k:  # alike: equal kinds (most often one object)
            columns = stacked_values(kinds[0], values, inverse)
        else:
            columns = stacked_features(meta_of, inverse)
        if inverse is not None:
            dims = dims[inverse]
            images = tuple(map(images.__getitem__, inverse.tolist()))
        full = dims[:, 2:]
        boxes = patch_boxes(seed, epoch, positions, dims[:, 0], dims[:, 1], patches.options)
        if not cut_rows(images, boxes, out, patches.options):
            return False
        del images
    if columns is None:
        return False
    # each box at full size: its corner within the image, its size within what is left
    box = boxes * patches.options.denominator  # a new array: the column, bounded in place
    corner = box[:, :2]
    np.minimum(corner, full - 1, out=corner)
    np.minimum(box[:, 2:], full - corner, out=box[:, 2:])
    columns["image"] = out
    columns["patch/box"] = box
    columns["patch/record"] = units
    if transform is not None:
        rngs = RowKeys(ctx.seed, ctx.epoch, positions) if transform.draws_random else None
        try:
            done = transform.apply_batch(columns, rngs, {"image": out})
        except DATA_ERRORS:
            raise
        except Exception as exc:  # a bug in it: the sample path names the record
            raise BatchFormFailed from exc
        if done is None or done.get("image") is not out:
            raise SchemaError(f"{transform!r} has no batch form for patches")
        columns = done
    buffer.write_columns(first_row, columns, written={"image": out})
    return True
