"""Samplers: how the Loader turns epoch positions into samples (records, windows, patches).

A *sampler* turns global epoch positions into sample dicts, reading records from a
:class:`~shardfeed.dataset.data_source.DataSource` (the data; a ``shardfeed.Dataset`` or a
user's own). The Loader owns everything that is the same for every kind of sample: the
shuffled order, the rank share, the thread pool, batching, prefetch, errors and state. A
sampler owns only what differs between records (:class:`RecordSampler`, here), windows of
frames (``Windows``, ``pipeline/windows.py``) and patches of images (``Patches``,
``pipeline/patches.py``)::

    Loader                                   Sampler
    ------                                   -------
    n = sampler.num_units                    how many things to shuffle
    total = sampler.samples_per_epoch(n)     how many outputs an epoch has
    ctx = EpochContext(seed, epoch,
                       EpochOrder(n, ...))
    sampler.begin_pass()                     (optional) a pass of the loader begins
    sampler.plan_for_processes(flag)         (optional) whether worker processes build its
                                             slices (this copy plans them only)
    for a slice of a batch (positions):
      ids = sampler.plan(ctx, positions)     record ids each output needs
      recs = sampler.read(unique ids)        one coalesced read for the slice
      for p, its ids:
        key = SampleKey(seed, epoch, p)
        sample = sampler.make_sample(key, ids, recs, transform)

How each sampler answers:

=========  ============  ====================  ===============================  ==========================
sampler    unit          samples_per_epoch(n)  plan(ctx, p)                     make_sample
=========  ============  ====================  ===============================  ==========================
records    a record      n                     ``[order[p]]``                   transform(record, rng)
windows    a window      n                     ``frames(order[p])`` (k ids)     transform every frame with
                                                                                a fresh ``key.rng()`` (same
                                                                                choices per frame), stack
                                                                                per-frame arrays on axis 0,
                                                                                label of the last frame
patches    an image      ``len(schedule)``     ``[order[q]]``, q = pick of the  crop of the (cached) decoded
                                               schedule with ``ctx.rng(p,       image with ``key.rng()``
                                               PICK)`` in ``window(p)``
=========  ============  ====================  ===============================  ==========================

Rules every sampler keeps (they are what make the Loader's output independent of thread count,
rank count, prefetch depth and timing):

* ``plan`` and ``make_sample`` are pure functions of their arguments (and of the dataset's
  bytes). All randomness comes from ``key.rng(purpose)`` / ``ctx.rng(position, purpose)``,
  which are keyed by ``(seed, epoch, position, purpose)``. A cache (the patch cache) may make
  them faster, never different.
* ``plan``, ``read`` and ``make_sample`` are called from many threads at once.
* ``make_sample`` returns a dict whose arrays have the same shapes and dtypes for every
  position (the Loader stacks them into preallocated batch arrays); values that are not
  arrays or numbers (bytes, strings, lists) are collected into lists.
* For process workers (``workers="processes"``) a sampler must pickle; the pickled copy is only
  asked for ``make_sample``, so it may leave out the data source.
* Optional: a sampler with ``accepts_out = True`` takes a keyword ``out`` in ``make_sample``:
  ``{"image": row view of the batch array}``; it passes it on as the transform's ``out=``
  (:func:`shardfeed.transforms.base.call_into`), so the image lands in the batch without a
  per-sample array. The Loader only passes it when the transform's ``output_spec`` matches
  the batch column; samplers without the attribute are called without it.
* ``state()`` returns the sampler's own JSON-serialisable keys (saved as the Loader state's
  ``"source"``): what decides which records (and crops) each position gets — the data
  source's fingerprint and the options such as the window length — and nothing that does not (caches, threads); ``restore(state)`` raises
  StateError naming the first key that differs (:func:`check_sampler_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardfeed.dataset.data_source import DataSource, Into, ReadsColumns, check_data_source
from shardfeed.errors import CorruptRecordError, DecodeError
from shardfeed.format.schema import Schema
from shardfeed.pipeline.sampler_state import check_sampler_state
from shardfeed.sampling.keys import sample_rng
from shardfeed.sampling.permutation import EpochOrder
from shardfeed.transforms.base import NO_RANDOMNESS, TransformBase, call_into
from shardfeed.transforms.base import bind_transform as bind_to
from shardfeed.transforms.wrap import adapt

Sample = dict[str, Any]
Transform = TransformBase
"""A transform as samplers hold it: bound, and wrapped once by ``transforms.base.adapt``."""


@dataclass(frozen=True, slots=True)
class SampleKey:
    """The identity of one output: ``(seed, epoch, position)``; ``rng()`` gives its randomness."""

    seed: int
    epoch: int
    position: int

    def rng(self, purpose: int = 0) -> np.random.Generator:
        """A fresh generator keyed by ``(seed, epoch, position, purpose)``; same key, same draws."""
        return sample_rng(self.seed, self.epoch, self.position, purpose)


@dataclass(frozen=True, slots=True)
class EpochContext:
    """What a sampler needs to plan the outputs of one epoch: the key and the shuffled units."""

    seed: int
    epoch: int
    order: EpochOrder
    total: int

    def rng(self, position: int, purpose: int = 0) -> np.random.Generator:
        """The keyed generator of one output position (see :class:`SampleKey`)."""
        return sample_rng(self.seed, self.epoch, position, purpose)

    def key(self, position: int) -> SampleKey:
        return SampleKey(self.seed, self.epoch, position)


@runtime_checkable
class Sampler(Protocol):
    """What the Loader needs from a sampler (records, windows or patches).

    See the module docstring for the contract and how each kind of sampler answers.
    """

    @property
    def num_units(self) -> int:
        """How many units the epoch order shuffles (records, windows or images)."""
        ...

    def samples_per_epoch(self, num_units: int) -> int:
        """How many outputs one epoch over ``num_units`` shuffled units has."""
        ...

    def bind(self, transform: Callable[..., Sample] | None) -> Transform | None:
        """Return the transform bound to the data source's schema (``transform.bind``), once."""
        ...

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        """The record ids each output at ``positions`` needs, in the order make_sample wants."""
        ...

    def read(self, records: Sequence[int]) -> list[Sample]:
        """Read and parse ``records`` (distinct ids), one dict each in the asked order."""
        ...

    def make_sample(
        self,
        key: SampleKey,
        record_ids: Sequence[int],
        records: Sequence[Sample],
        transform: Transform | None,
    ) -> Sample:
        """Build the output ``key.position`` from its read records and keyed randomness."""
        ...

    def locate(self, record: int) -> tuple[str, int, int]:
        """``(path, record within shard, byte offset)`` of a record id, for error messages."""
        ...

    def feature_lengths(self) -> Mapping[str, int | None]:
        """Stored length of each numeric feature (None if it varies), for batching rules."""
        ...

    @property
    def index_bytes(self) -> int:
        """Bytes of index the sampler keeps in memory (offsets, windows, ...)."""
        ...

    def state(self) -> dict[str, Any]:
        """The sampler's own state keys (a configuration fingerprint), JSON-serialisable."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None:
        """Check a state from :meth:`state`; raise StateError if it is not this sampler's."""
        ...


DATA_ERRORS: tuple[type[Exception], ...] = (CorruptRecordError, DecodeError)
"""Every failure what one record holds can cause in the read and decode path (see
:mod:`~shardfeed.pipeline.produce`)."""


class BatchFormFailed(Exception):
    """A transform's batch form raised something other than a data error (chained): a bug
    in it, which the sample-by-sample path then meets again and names with the record."""


@runtime_checkable
class ReadsColumnsSampler(Protocol):
    """A sampler whose samples' records can be read as columns (the batch path: see
    :class:`~shardfeed.dataset.data_source.ReadsColumns`); None where these records are not
    alike or its data source has no column form."""

    def read_columns(self, records: Sequence[int] | np.ndarray, *,
                     into: Into | None = None) -> dict[str, Any] | None: ...


@runtime_checkable
class SingleRecordSampler(Protocol):
    """A sampler whose every sample is one record: :meth:`single_records` is its plan as one
    int64 array (no tuple a sample)."""

    def single_records(self, ctx: EpochContext, positions: np.ndarray) -> np.ndarray: ...


def bind_transform(
    transform: Callable[..., Sample] | None, schema: Schema | None, root: str | None
) -> Transform | None:
    """``transform`` bound to a schema (``transform.bind(schema, root=root)``) if it can be
    bound, as a :class:`~shardfeed.transforms.base.TransformBase` (wrapped once by
    :func:`~shardfeed.transforms.base.adapt`: a plain one-argument ``f(sample) -> sample`` is
    called without the generator)."""
    if transform is None:
        return None
    if not callable(transform):
        raise TypeError(
            f"transform must be callable as transform(sample, rng) -> sample, got {transform!r}"
        )
    if isinstance(transform, type):  # a class, not a transform: nothing to bind
        return adapt(transform)
    return adapt(bind_to(transform, schema, root=root))


class SamplerBase:
    """The part every sampler over one DataSource shares: the data, its size and lookups.

    Subclasses call :meth:`_attach` in ``__init__`` and set ``_no_dataset``, the message of
    the RuntimeError that :meth:`_ds` raises in a copy without the dataset (process workers).
    State: none of its own. Memory: the dataset's index (8 bytes a record).
    """

    dataset: DataSource | None
    _len: int
    _lengths: dict[str, int | None]
    _fingerprint: str
    _no_dataset = "this copy of the sampler has no data source"

    def _attach(self, dataset: object, *, needs: str) -> None:
        """Keep ``dataset`` after checking it is a DataSource; ``needs`` starts the TypeError."""
        data = check_data_source(dataset, needs=needs)
        self.dataset = data
        self._len = len(data)
        self._lengths = _schema_lengths(data.schema)
        self._fingerprint = data.fingerprint

    def _ds(self) -> DataSource:
        if self.dataset is None:
            raise RuntimeError(self._no_dataset)
        return self.dataset

    @property
    def num_units(self) -> int:
        return self._len

    def locate(self, record: int) -> tuple[str, int, int]:
        return self._ds().locate(record)

    def feature_lengths(self) -> Mapping[str, int | None]:
        return self._lengths

    @property
    def index_bytes(self) -> int:
        return 8 * (self._len + 1)


_LOADER_NEEDS = ("a Loader source must be a shardfeed.Dataset or another shardfeed.DataSource "
                 "(or Windows/Patches over one)")


class RecordSampler(SamplerBase):
    """One output per record of a Dataset: the record at order position p, transformed.

    Determinism: output p is ``transform(ds[order[p]], sample_rng(seed, epoch, p))`` (a
    transform that declares ``draws_random = False`` gets ``NO_RANDOMNESS`` instead).
    State: ``{"kind": "records", "records": len(ds), "dataset": ds.fingerprint}``. Memory: the dataset's
    index (8 bytes a record); nothing per sample beyond the record being built (the image is
    written into the batch when ``out`` is given).
    """

    kind = "records"
    accepts_out = True
    _no_dataset = "this copy of the record sampler has no data source (process copy)"

    def __init__(self, dataset: DataSource, /) -> None:
        self._attach(dataset, needs=_LOADER_NEEDS)

    def __getstate__(self) -> dict[str, Any]:
        # Process workers only call make_sample: leave the dataset (open files) behind.
        return {"dataset": None, "_len": self._len, "_lengths": self._lengths,
                "_fingerprint": self._fingerprint}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.dataset = state["dataset"]
        self._len = state["_len"]
        self._lengths = state["_lengths"]
        self._fingerprint = state["_fingerprint"]

    def samples_per_epoch(self, num_units: int) -> int:
        return num_units

    def bind(self, transform: Callable[..., Sample] | None) -> Transform | None:
        ds = self._ds()
        return bind_transform(transform, ds.schema, ds.root)

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        return [(u,) for u in self.single_records(ctx, positions).tolist()]

    def single_records(self, ctx: EpochContext, positions: np.ndarray) -> np.ndarray:
        """:meth:`plan` as one int64 array: a sample here is one record (the batch path
        reads a slice's records with it, no tuple a sample)."""
        return ctx.order.take(np.asarray(positions, dtype=np.int64))

    def read(self, records: Sequence[int]) -> list[Sample]:
        return self._ds().read_many(list(records))

    def read_columns(self, records: Sequence[int] | np.ndarray, *,
                     into: Into | None = None) -> dict[str, Any] | None:
        """The records as columns (the data source's ``read_columns``, ``into`` passed on
        where given), or None when the source has no column form or these records are not
        alike."""
        ds = self._ds()
        if not isinstance(ds, ReadsColumns):
            return None
        columns: dict[str, Any] | None = (
            ds.read_columns(records) if into is None else ds.read_columns(records, into=into))
        return columns

    def make_sample(
        self,
        key: SampleKey,
        record_ids: Sequence[int],
        records: Sequence[Sample],
        transform: Transform | None,
        *,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> Sample:
        return record_sample(key, records[0], transform, out)

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "records": self._len, "dataset": self._fingerprint}

    def restore(self, state: Mapping[str, Any]) -> None:
        check_sampler_state(state, self.state(), sampler="record source")


def record_sample(key: SampleKey, record: Sample, transform: Transform | None,
                  out: Mapping[str, np.ndarray] | None) -> Sample:
    """The output of one record: ``transform(record, key.rng())`` (the image written into
    ``out["image"]`` where given), or the record itself without a transform."""
    if transform is None:  # nothing mutates it: the batch writer only reads
        return record if type(record) is dict else dict(record)
    sample = dict(record)  # transforms edit their sample; the read record stays as read
    # A transform that declares it never draws (eval presets) gets no keyed generator.
    rng = key.rng() if transform.draws_random else NO_RANDOMNESS
    image_out = None if out is None else out.get("image")
    if image_out is None:
        return transform(sample, rng)
    return call_into(transform, sample, rng, image_out)


def _schema_lengths(schema: Schema | None) -> dict[str, int | None]:
    if schema is None:
        return {}
    return {name: info.length for name, info in schema.features.items()}


def as_sampler(source: object) -> Sampler:
    """A Sampler for ``source``: itself if it is one (Windows, Patches, a record sampler), else
    a :class:`RecordSampler` over it, which checks it is a DataSource (TypeError naming the
    missing member)."""
    if isinstance(source, Sampler):
        return source
    return RecordSampler(check_data_source(source, needs=_LOADER_NEEDS))
