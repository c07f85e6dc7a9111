"""Patches' images read and decoded in one compiled call that holds no GIL.

An image :class:`~shardfeed.pipeline.patches.Patches` decodes is read from its mapped local
shard, checked, parsed and, a plain JPEG, decoded at DCT scale ``1/d`` by ``_jpeg_record.c``
in one call: no bytes object for the record or its JPEG, and none of the Python of the read
and of :func:`~shardfeed.transforms.decode.patches.decode_for_patches` around it. On 2 cores,
1566² JPEGs cut into 32² patches, the decode threads' GIL time a patch fell from 3.7 to 1.5
µs (about 150 µs an image). The pixels are simplejpeg's (``decode_jpeg(..., fastdct=True)``),
the other features those :meth:`~shardfeed.dataset.Dataset.read_many` gives: the same
:class:`~shardfeed.transforms.decode.patches.DecodedImage`.

Only where nothing else is asked of the image: a local dataset read through maps (no feature
spec), an image feature of encoded bytes, no mask, uint8 images, ``exif_orientation=
"ignore"``, a :class:`~shardfeed.dataset.Dataset` whose ``read_many`` is its own. A record
the call does not take (another encoding, a CMYK or grey JPEG, a sampling simplejpeg's header
reader does not name, under 8 pixels a side at a DCT scale, more than ``max_pixels``, a
damaged one, a bad CRC) is read and decoded by the Python path, which gives the same image
or names the fault. The libjpeg the call was built with is the machine's, the
Python path's decoder brings its own: :func:`agrees` compares them once a process, and where
they differ the call is not used.

Determinism: pure. State: the dataset's maps, taken on first use (a copy in another process
takes its own). Memory: one record's bytes and its decoded image while the call runs.
"""

from __future__ import annotations

import bisect
import functools
import logging
import threading
from typing import Any

import numpy as np

from shardfeed.dataset import Dataset
from shardfeed.dataset.data_source import DataSource
from shardfeed.format.columns import record_of_columns
from shardfeed.format.native import compiled_module
from shardfeed.storage.process_state import PROCESS
from shardfeed.transforms.decode.fields import ImageField
from shardfeed.transforms.decode.patches import DecodedImage, meta_kinds

compiled = compiled_module("shardfeed.pipeline._jpeg_record")
"""The compiled call; None where built without a C compiler or libjpeg."""

MAX_MISSES = 8
"""Records the call did not take, none taken, after which it is not asked again (a dataset of
PNGs, say: each miss costs a record's copy and parse)."""

_FIRST = np.zeros(1, dtype=np.int64)
_FIRST.flags.writeable = False


@functools.cache
def agrees() -> bool:
    """Whether the compiled call gives simplejpeg's pixels here, checked once a process on
    small JPEGs (4:2:0, 4:2:2 and 4:4:4, sizes that are not whole blocks) at every scale
    (two threads asking first may both check: the same answer)."""
    why = "gives other pixels than simplejpeg here (another libjpeg)"
    try:
        same = _self_check()
    except Exception:
        same, why = False, "could not be checked"
        logging.getLogger(__name__).debug("the check failed", exc_info=True)
    if not same:
        logging.getLogger(__name__).warning(
            "the compiled record decode %s: Patches' images are decoded by the Python path",
            why)
    return same


def _self_check() -> bool:
    import simplejpeg

    from shardfeed.format.example import encode_example
    from shardfeed.format.framing import frame

    assert compiled is not None
    y, x = np.mgrid[0:83, 0:117]
    pixels = np.dstack([x * 2, y * 3, (x * y) % 251]).astype(np.uint8)
    for subsampling in ("420", "422", "444"):
        data = bytes(simplejpeg.encode_jpeg(pixels, quality=87, colorsubsampling=subsampling))
        blob = frame(encode_example({"image/encoded": data, "label": [3]}))
        offsets = np.array([0, len(blob)], dtype=np.int64)
        one = np.zeros(1, dtype=np.int64)
        for d in (1, 2, 4, 8):
            got = compiled.decode((blob,), (offsets,), one, one, True,
                                  (b"image/encoded", b"label"), 2, 0, d, 1 << 20)
            kwargs = {} if d == 1 else {"min_height": -(-83 // d), "min_width": -(-117 // d)}
            want = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=True, **kwargs)
            if got is None or (got[1], got[2]) != want.shape[:2] or bytes(got[0]) != want.tobytes():
                return False
    return True


class NativeImages:
    """The compiled read and decode of one Patches' images (see the module doc); ``load``
    gives None where it does not apply, and the caller takes the Python path."""

    def __init__(self, image_field: ImageField, mask_field: ImageField | None, *,
                 require_mask: bool | None, denominator: int, max_pixels: int) -> None:
        self._denominator = denominator
        self._max_pixels = max_pixels
        self._mask_field = mask_field
        # what the Python path would do other than decode the JPEG's pixels
        self.enabled = (compiled is not None and require_mask is not True
                        and image_field.key is not None and image_field.encoding == "auto"
                        and image_field.shape is None and image_field.image_dtype == "uint8"
                        and image_field.exif_orientation == "ignore")
        self._key = image_field.key
        # (mapped shards, keys, count, at, others, each shard's first record id)
        self._plan: tuple[Any, ...] | None = None
        self._plan_lock = threading.Lock()
        self._taken = self._missed = 0  # a race loses a count at worst
        PROCESS.at_fork(self, NativeImages._forked)

    def _forked(self) -> None:
        """In a forked child: a new lock (the fork rule: a parent's thread may have held it)."""
        self._plan_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # the maps stay in this process; a copy takes its own dataset's on first use
        return {**self.__dict__, "_plan": None, "_plan_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._forked()  # a lock of its own
        PROCESS.at_fork(self, NativeImages._forked)

    def load(self, ds: DataSource, rid: int) -> DecodedImage | None:
        """Record ``rid``'s image decoded, with its other features; None where the call does
        not apply to this dataset or does not take this record."""
        if not self.enabled:
            return None
        plan = self._plan or self._make_plan(ds, rid)
        if plan is None:
            return None
        mapped, keys, count, at, others, starts = plan
        if not mapped.is_open():  # closed: the Python path says so
            return None
        shard = bisect.bisect_right(starts, rid) - 1  # a list: NumPy's search costs ~10 µs
        assert compiled is not None
        # the record's shard alone: the call takes the buffers of the maps it is given
        got = compiled.decode((mapped.maps[shard],), (mapped.offsets[shard],), _FIRST,
                              np.array([rid - starts[shard]], np.int64), mapped.verify,
                              keys, count, at, self._denominator, self._max_pixels)
        if got is None:
            self._missed += 1
            if self._missed >= MAX_MISSES and not self._taken:
                self.enabled = False
            return None
        self._taken += 1
        pixels, height, width, full_height, full_width, columns, read = got
        mapped.count_read(read)  # a shard replaced since the dataset opened raises here
        meta = record_of_columns(others, columns)
        image = np.frombuffer(pixels, np.uint8).reshape(height, width, 3)
        return DecodedImage(image, None, meta, (full_height, full_width), meta_kinds(meta))

    def _make_plan(self, ds: DataSource, rid: int) -> tuple[Any, ...] | None:
        with self._plan_lock:
            if self._plan is not None:
                return self._plan
            # a Dataset whose records are read_many's own (a subclass that reads them
            # otherwise, or a wrapper, goes the Python path)
            mapped = None
            if isinstance(ds, Dataset) and type(ds).read_many is Dataset.read_many:
                mapped = ds.mapped_shards(np.array([rid], dtype=np.int64))
            names = () if mapped is None else mapped.names
            mask = self._mask_field
            if (mapped is None or self._key not in names or not agrees()
                    or (mask is not None and mask.locate(dict.fromkeys(names)) is not None)):
                self.enabled = False
                return None
            try:
                keys = tuple(name.encode() for name in names)
            except UnicodeEncodeError:
                self.enabled = False
                return None
            at = names.index(self._key)
            others = names[:at] + names[at + 1:]
            self._plan = (mapped, keys, len(names) if mapped.exact else -1, at, others,
                          mapped.starts.tolist())
            return self._plan
