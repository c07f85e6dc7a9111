"""Build the samples of one batch slice: plan, one coalesced read, make each sample, write rows.

Errors. Data errors are :class:`CorruptRecordError` (a damaged record) and :class:`DecodeError`
(an image that does not decode, is larger than ``max_pixels``, runs out of memory; a raw
image whose stored shape is not ints; a referenced path that is not UTF-8 text): every
failure that what one record holds can cause in shardfeed's read and decode path is one of
the two. With ``on_error="raise"`` they stop the loader and name the shard, record and byte
offset (taken from ``sampler.locate``). Any other exception raised by a transform (a bug in
user code) always propagates unchanged — same object, original traceback — with a note
naming the epoch position, the record and the stage.

Skipping. With ``on_error="skip"`` a bad sample at position ``p`` is replaced by the sample of
another position ``q`` of the same epoch, drawn from the generator keyed ``(seed, epoch, p,
PURPOSE_REPLACE)`` (up to :data:`MAX_REPLACEMENT_TRIES` draws; every bad draw is counted too).
The replacement is thus fixed by the key alone: the same for any number of threads, processes
or ranks, and the same after a restore.

Writing in place. When the sampler can write into the batch (``sampler.accepts_out``) and the
transform declares (``output_spec``) an ``"image"`` of exactly the batch column's shape and
dtype, each sample's image is written by the transform's last op straight into its row of
the batch array (``out=``): no image-sized array is allocated or copied per sample.

Determinism: every sample is a function of ``(seed, epoch, position)`` and the data; writing
in place gives the same bytes. State: none (the Loader counts skipped samples). Memory: the
slice's records while it is built.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.errors import (
    CorruptRecordError,
    DecodeError,
    SchemaError,
    ShardfeedError,
    location,
)
from shardfeed.pipeline.batching import BatchBuffer, BatchLayout
from shardfeed.pipeline.native_slices import NativeSlices
from shardfeed.pipeline.samplers import (
    DATA_ERRORS,
    BatchFormFailed,
    EpochContext,
    ReadsColumnsSampler,
    Sample,
    SampleKey,
    Sampler,
    SingleRecordSampler,
    Transform,
)
from shardfeed.pipeline.stage_clocks import ASSEMBLE, BUSY, DECODE, READ, SLICES, StageClock
from shardfeed.pipeline.stage_stats import stage_of
from shardfeed.sampling.crop_draws import RowKeys
from shardfeed.sampling.keys import SKIP_REPLACEMENT
from shardfeed.storage.inflight import cancelled
from shardfeed.transforms.base import (
    Compose,
    bytes_into_of,
    child_timings,
    has_batch_form,
    stop_timings,
)

BATCH_PATH_RETRIED: tuple[type[Exception], ...] = (*DATA_ERRORS, SchemaError)
"""What makes the batch path hand its rows to the sample-by-sample path (see build_slice)."""
PURPOSE_REPLACE = int(SKIP_REPLACEMENT)
MAX_REPLACEMENT_TRIES = 16


_RETRY_SAMPLE_BY_SAMPLE: tuple[type[Exception], ...] = (*BATCH_PATH_RETRIED, BatchFormFailed)
_ROWS_RETRIED: tuple[type[Exception], ...] = (*DATA_ERRORS, BatchFormFailed)
"""What makes a sampler's own rows (``build_rows``) hand the slice to the sample path."""


class TooManyBadSamples(ShardfeedError):
    """Every replacement draw for one position was bad as well (the Loader raises it as its
    ``TooManyErrorsError`` while iterating); chained from the last bad record's error."""


class SliceBuilder:
    """Builds slices of batches for one loader; shared by all worker threads.

    Determinism, state and memory: see the module docstring.
    """

    def __init__(self, sampler: Sampler, transform: Transform | None, *, skip: bool) -> None:
        self.sampler = sampler
        self.transform = transform
        self.skip = skip
        self._direct: tuple[BatchLayout, tuple[str, ...]] | None = None
        self._direct_lock = threading.Lock()
        # the batch path (see build_slice): the sampler reads columns, the transform has a
        # batch form (or there is no transform)
        has_form = transform is None or has_batch_form(transform)
        self._read_columns = (sampler.read_columns if has_form
                              and isinstance(sampler, ReadsColumnsSampler) else None)
        # features the transform's batch form copies as they are: the reader puts them there
        self._bytes_into = bytes_into_of(transform) if transform is not None else None
        # a sampler whose samples are a fixed number of frames stacks their columns
        stack = getattr(sampler, "stack_columns", None)
        self._frames: int = int(getattr(sampler, "frames_per_sample", 1)) if stack else 1
        self._stack_columns: Callable[[dict[str, Any], int], dict[str, Any]] | None = stack
        # a sampler whose samples are one record each gives them as one array
        self._single_records: Callable[[EpochContext, np.ndarray], np.ndarray] | None = (
            sampler.single_records if isinstance(sampler, SingleRecordSampler) else None)
        # a sampler that writes a slice's rows itself (Patches), where no transform follows
        # or the transform has a batch form
        self._build_rows: Callable[..., bool] | None = (
            getattr(sampler, "build_rows", None) if has_form else None)
        # light records: a whole slice in one compiled call without the GIL, where it applies
        self._native = NativeSlices.of(sampler, transform) if self._read_columns else None
        self.clock = StageClock()  # where the slices' time goes (see stage_stats)
        # the whole transform's stage, sample by sample (a sampler that decodes its images,
        # Patches, makes its samples' pixels itself)
        self._stage = (DECODE if getattr(sampler, "decodes_images", False)
                       and (transform is None or isinstance(transform, Compose))
                       else stage_of(transform))

    def direct_keys(self, layout: BatchLayout) -> tuple[str, ...]:
        """The keys samples write straight into the batch for ``layout`` (see module doc)."""
        cached = self._direct
        if cached is not None and cached[0] is layout:
            return cached[1]
        with self._direct_lock:
            keys = in_place_keys(self.sampler, self.transform, layout)
            self._direct = (layout, keys)
        return keys

    # -- places, for messages -------------------------------------------------------------------

    def describe(self, position: int, record_ids: Sequence[int]) -> str:
        places = []
        for record in record_ids[:4]:
            try:
                path, in_shard, offset = self.sampler.locate(int(record))
                places.append(f"record id {record}: {location(path, in_shard, offset)}")
            except Exception:  # noqa: BLE001 - a message must never fail to be built
                places.append(f"record id {record}")
        if len(record_ids) > 4:
            places.append(f"... {len(record_ids) - 4} more records")
        return f"epoch position {position} ({'; '.join(places)})"

    def located(self, exc: BaseException, key: SampleKey, record_ids: Sequence[int],
                stage: str) -> BaseException | None:
        """A located replacement for a data error, or None after adding a note to ``exc``."""
        where = self.describe(key.position, record_ids)
        if isinstance(exc, DATA_ERRORS) and getattr(exc, "path", None) is None and record_ids:
            path, in_shard, offset = self.sampler.locate(int(record_ids[0]))
            message = f"{exc} [{stage} of epoch {key.epoch}, {where}]"
            if isinstance(exc, CorruptRecordError):
                return CorruptRecordError(message, path=path, record=in_shard, offset=offset)
            return DecodeError(message, path=path, record=in_shard, offset=offset)
        exc.add_note(f"shardfeed: raised in stage '{stage}' of epoch {key.epoch}, {where}")
        return None

    # -- one sample ----------------------------------------------------------------------------

    def make(self, key: SampleKey, record_ids: Sequence[int], records: Sequence[Sample],
             out: Mapping[str, np.ndarray] | None = None) -> Sample:
        """``sampler.make_sample`` with errors located (raises; the caller decides on skips).

        ``out``: batch slots to write into (only passed to samplers that accept it).
        """
        try:
            if out:
                return self.sampler.make_sample(  # type: ignore[call-arg]
                    key, record_ids, records, self.transform, out=out
                )
            return self.sampler.make_sample(key, record_ids, records, self.transform)
        except Exception as exc:
            replacement = self.located(exc, key, record_ids, "transform")
            if replacement is not None:
                raise replacement from exc
            raise

    def read(self, record_ids: Sequence[int]) -> dict[int, Sample]:
        unique = list(dict.fromkeys(map(int, record_ids)))
        if not unique:
            return {}
        return dict(zip(unique, self.sampler.read(unique)))

    def sample_at(self, ctx: EpochContext, position: int) -> tuple[Sample, int]:
        """The sample at ``position`` (or its replacement) and how many bad samples it met."""
        try:
            return self._build_one(ctx, position), 0
        except DATA_ERRORS:
            if not self.skip:
                raise
        sample, bad, _ = self.replacement(ctx, position)
        return sample, bad + 1

    def _build_one(self, ctx: EpochContext, position: int) -> Sample:
        ids = self.sampler.plan(ctx, np.array([position], dtype=np.int64))[0]
        key = ctx.key(position)
        try:
            records = self.read(ids)
        except Exception as exc:
            replacement = self.located(exc, key, ids, "read")
            if replacement is not None:
                raise replacement from exc
            raise
        return self.make(key, ids, [records[int(i)] for i in ids])

    def replacement(self, ctx: EpochContext, position: int) -> tuple[Sample, int, int]:
        """The deterministic stand-in for the bad sample at ``position``: the sample, the bad
        draws met, and the position it is the sample of."""
        rng = ctx.rng(position, PURPOSE_REPLACE)
        bad = 0
        last: BaseException | None = None
        for _ in range(MAX_REPLACEMENT_TRIES):
            other = int(rng.integers(ctx.total))
            try:
                return self._build_one(ctx, other), bad, other
            except DATA_ERRORS as exc:
                bad += 1
                last = exc
        raise TooManyBadSamples(
            f"{MAX_REPLACEMENT_TRIES} replacement draws for epoch position {position} were all "
            f"bad records (the last: {last})"
        ) from last

    # -- one slice -------------------------------------------------------------------------------

    def read_slice(self, ctx: EpochContext, positions: np.ndarray) -> tuple[
        list[Sequence[int]], dict[int, Sample], dict[int, BaseException]
    ]:
        """Plan and read a slice; with skipping, bad records are returned apart, not raised."""
        plans = self.sampler.plan(ctx, positions)
        all_ids = [int(i) for ids in plans for i in ids]
        try:
            return plans, self.read(all_ids), {}
        except DATA_ERRORS:
            if not self.skip:
                # name the sample whose record is bad: find it by reading one at a time
                self._raise_first_bad(ctx, positions, plans)
                raise
        records: dict[int, Sample] = {}
        bad: dict[int, BaseException] = {}
        for record in dict.fromkeys(all_ids):
            try:
                records[record] = self.sampler.read([record])[0]
            except DATA_ERRORS as exc:
                bad[record] = exc
        return plans, records, bad

    def _raise_first_bad(self, ctx: EpochContext, positions: np.ndarray,
                         plans: list[Sequence[int]]) -> None:
        for position, ids in zip(positions, plans):
            for record in ids:
                try:
                    self.sampler.read([int(record)])
                except DATA_ERRORS as exc:
                    replacement = self.located(exc, ctx.key(int(position)), [record], "read")
                    if replacement is not None:
                        raise replacement from exc
                    raise

    def build_slice(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                    first_row: int) -> int:
        """Write the samples of ``positions`` into rows ``first_row...``; returns bad samples met.

        The native slice first where it applies (:mod:`~.native_slices`: one compiled call,
        no GIL; a slice it does not accept goes on here), then the batch path
        (:meth:`build_columns`); a data error there (a damaged record
        or image, a value that does not fit), an exception from the transform's batch form,
        or columns it cannot take, and the rows are made sample by sample, which reports or
        skips exactly, naming the record. Storage errors and interrupts are not retried: they
        propagate as they are.
        """
        started = time.perf_counter()
        try:
            return self._build_slice(ctx, positions, buffer, first_row)
        finally:
            acc = self.clock.mine()
            acc[BUSY] += time.perf_counter() - started
            acc[SLICES] += 1

    def _build_slice(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                     first_row: int) -> int:
        clock = self.clock
        native = self._native
        if native is not None and native.enabled:
            started = time.perf_counter()
            built = native.build(ctx, positions, buffer, first_row)
            clock.add(DECODE, time.perf_counter() - started)  # read and decode at once
            if built:
                return 0
        build_rows = self._build_rows
        if build_rows is not None:
            started = time.perf_counter()
            timings = child_timings()  # the transform after the rows: its ops' own stages
            try:
                if build_rows(ctx, positions, buffer, first_row, self.transform):
                    return 0
            except _ROWS_RETRIED:
                pass  # the sample-by-sample path below meets it again and says where
            except SchemaError:
                self._build_rows = None  # rows this sampler cannot write: stop trying
            finally:
                self._add_transform(timings, time.perf_counter() - started, DECODE)
        read_columns = self._read_columns  # once: another thread may turn the path off
        if read_columns is not None:
            try:
                if self.build_columns(ctx, positions, buffer, first_row, read_columns):
                    return 0
            except _RETRY_SAMPLE_BY_SAMPLE:
                pass  # the sample-by-sample path below meets it again and says where
        return self.build_samples(ctx, positions, buffer, first_row)

    def build_columns(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                      first_row: int, read_columns: Callable[..., Any]) -> bool:
        """The rows of ``positions`` a slice at a time: the records read as columns, the
        transform's batch form writing images into the rows, the other columns stored at once.
        False (nothing promised about the rows) when the columns or transform do not allow it.
        """
        single = self._single_records
        frames = self._frames  # records a sample where the sampler stacks them (windows)
        if single is not None:
            records = single(ctx, positions)
        else:
            plans = self.sampler.plan(ctx, positions)
            if any(len(ids) != frames for ids in plans):
                return False
            records = np.array(plans, dtype=np.int64).reshape(-1)
        samples = len(positions)
        windows = {f.name: buffer.arrays[f.name][first_row : first_row + samples]
                   for f in buffer.layout.fields
                   if f.name == "image" and f.is_array and not f.squeeze}
        # each frame a row of its own: the transform's batch form sees rows of one record
        stack = self._stack_columns
        out = windows if stack is None else {
            name: rows.reshape(samples * frames, *rows.shape[2:])
            for name, rows in windows.items() if rows.shape[1:2] == (frames,)}
        if stack is None:  # a crop's masks, written beside its images
            out.update({f.name: buffer.arrays[f.name][first_row : first_row + samples]
                        for f in buffer.layout.fields
                        if f.name == "mask" and f.is_array and not f.squeeze})
        bytes_into = self._bytes_into
        clock = self.clock
        started = time.perf_counter()
        if bytes_into is not None and out:
            columns = read_columns(records, into=lambda names: bytes_into(names, out))
        else:
            columns = read_columns(records)
        now = time.perf_counter()
        clock.add(READ, now - started)
        if columns is None:
            return False
        transform = self.transform
        if transform is not None:
            # a window's frames share its key: each frame draws what the sample path draws
            keyed = positions if stack is None else np.repeat(positions, frames)
            rngs = RowKeys(ctx.seed, ctx.epoch, keyed) if transform.draws_random else None
            timings = child_timings()  # a Compose's ops, each to its stage
            try:
                columns = transform.apply_batch(columns, rngs, out)
            except BATCH_PATH_RETRIED:
                raise
            except Exception as exc:  # a bug in a transform: the sample path names the record
                raise BatchFormFailed from exc
            finally:
                now = self._add_transform(timings, time.perf_counter() - now)
            if columns is None:
                self._read_columns = None  # no batch form for this data: stop trying
                return False
        if stack is not None:
            in_place = [name for name, rows in out.items() if columns.get(name) is rows]
            columns = stack(columns, samples)
            out = {name: windows[name] for name in in_place
                   if np.shape(columns[name]) == windows[name].shape}
            columns.update(out)  # frames written in place: their windows' rows
        buffer.write_columns(first_row, columns, written=out)
        clock.add(ASSEMBLE, time.perf_counter() - now)
        return True

    def build_samples(self, ctx: EpochContext, positions: np.ndarray, buffer: BatchBuffer,
                      first_row: int) -> int:
        """:meth:`build_slice` one sample at a time; returns bad samples met."""
        clock = self.clock.mine()
        started = time.perf_counter()
        plans, records, bad_records = self.read_slice(ctx, positions)
        now = time.perf_counter()
        clock[READ] += now - started
        made = written = 0.0
        timings = child_timings()  # a Compose's ops, each to its stage
        try:
            direct = self.direct_keys(buffer.layout)
            columns = [(k, buffer.arrays[k]) for k in direct]
            seed, epoch = ctx.seed, ctx.epoch
            make, write = self.make, buffer.write
            skipped = 0
            row = first_row
            for position, ids in zip(positions.tolist(), plans):
                if cancelled():  # the pass was ended (Loader.close()): no more samples
                    raise RuntimeError("this Loader was closed while it made the batch")
                key = SampleKey(seed, epoch, position)
                slots = {k: column[row] for k, column in columns} if columns else None
                sample: Sample | None = None
                if not bad_records or not any(int(i) in bad_records for i in ids):
                    try:
                        sample = make(key, ids, [records[i] for i in ids], slots)
                    except DATA_ERRORS:
                        if not self.skip:
                            raise
                if sample is None:
                    sample, bad, buffer.keys[row] = self.replacement(ctx, position)
                    skipped += bad + 1
                    slots = None
                then = time.perf_counter()
                made += then - now
                write(row, sample, written=slots, where=_Where(self, position, ids))
                now = time.perf_counter()
                written += now - then
                row += 1
        finally:
            self._add_transform(timings, made)  # (stops the timing on an error too)
        clock[ASSEMBLE] += written
        return skipped

    def _add_transform(self, timings: list[tuple[Any, float]], spent: float,
                       rest: int | None = None) -> float:
        """``spent`` seconds of making samples or running the transform's batch form, to
        their stages: each op a Compose timed (``timings``) to its own, the rest to
        ``rest`` (the transform's stage where None); returns the clock now."""
        stop_timings()
        clock = self.clock
        for part, seconds in timings:
            clock.add(stage_of(part), seconds)
            spent -= seconds
        timings.clear()
        clock.add(self._stage if rest is None else rest, max(spent, 0.0))
        return time.perf_counter()


class _Where:
    """The place of a sample for an error message, built only if one is raised."""

    __slots__ = ("builder", "ids", "position")

    def __init__(self, builder: SliceBuilder, position: int, ids: Sequence[int]) -> None:
        self.builder = builder
        self.position = position
        self.ids = ids

    def __call__(self) -> str:
        return self.builder.describe(self.position, self.ids)


def in_place_keys(source: Any, transform: Transform | None, layout: BatchLayout) -> tuple[str, ...]:
    """Keys a sample of ``source`` + ``transform`` can write straight into ``layout``'s arrays.

    Only ``"image"``, and only when the source accepts ``out=`` and the transform declares an
    output spec for it of exactly the batch column's shape and dtype (a transform that does
    not declare one keeps the copy, and its shape errors stay SchemaErrors).
    """
    if transform is None or not getattr(source, "accepts_out", False):
        return ()
    # Every transform declares output_spec (TransformBase's default, None, says "no spec"):
    # one that raises is a bug in it, reported here rather than costing the fast path quietly.
    specs = transform.output_spec({})
    if not specs:
        return ()
    keys = []
    for f in layout.fields:
        spec = specs.get(f.name)
        if (f.name == "image" and f.is_array and not f.squeeze and spec is not None
                and spec.fixed and tuple(spec.shape) == f.shape
                and spec.dtype == np.dtype(f.dtype)):
            keys.append(f.name)
    return tuple(keys)


def describe_value(value: Any) -> str:
    """Short description of a sample value for messages."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {value.shape}"
    return type(value).__name__
