"""Mixtures: every epoch draws from several data sources in stated proportions, exactly.

::

    Mixture([a, b], weights=[0.7, 0.3])                      an epoch of n outputs
    counts     c_s = n * w_s, rounded by largest remainder     (they sum to n)
    slots      0 .. c_a-1 are a's, c_a .. n-1 are b's          (the units the Loader shuffles)
    position p -> slot u = order[p] -> source s, j = u - start_s
               -> record perm(s, pass = j // len_s)[j % len_s] of source s

The Loader's exact shuffle of the ``n`` slots places each source's outputs uniformly over
the epoch, so an epoch holds exactly ``c_s`` outputs of source ``s`` (the proportions are
met exactly, not within sampling error), and a batch holds a hypergeometric share of each.
Within a source, slot ``j`` takes the ``j % len_s``-th record of that source's own uniform
permutation for pass ``j // len_s``: every record of a source comes at most once per pass.

The default ``n`` is the largest epoch in which no source needs a second pass:
``min_s floor(len_s / w_s)`` (weights normalised), so the source that runs out first is
read once, whole, and the others in their stated share. ``epoch_size`` sets ``n``; a source
whose share outruns it starts a new pass, in a new order. A source whose share rounds to no
output (``n w_s < 1``, e.g. weight 0.001 in an epoch of 150) would never appear: the mixture
warns once at construction, naming it, its expected count an epoch and the ``epoch_size``
that gives it one.

Class balance is a mixture of one dataset's classes (:meth:`Mixture.balanced`): each class a
source of its own (a :class:`Subset`), equal weights unless stated, and by default an epoch
as long as the dataset (as torch's ``WeightedRandomSampler`` is usually given): rare classes
repeat in passes, common ones give a share of their records each epoch.

Determinism: output p is a pure function of ``(seed, epoch, p)`` and the sources (the slot
order is the Loader's ``EpochOrder``; each pass's permutation is keyed by ``(seed, epoch,
source, pass)`` under purpose MIXTURE), whatever the threads or ranks; so a restored Loader
state continues at any batch. ``shuffle=False``: slots and records in stored order.
State: ``{"kind": "mixture", "records", "dataset", "weights", "epoch_size"}``. Memory: the
sources' indexes, each subset's record ids (8 bytes a record), and 4 bytes a record of each
source for the permutations of the epochs in use.
"""

from __future__ import annotations

import hashlib
import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfeed.dataset.data_source import DataSource, check_data_source
from shardfeed.errors import SchemaError
from shardfeed.pipeline.sampler_state import check_sampler_state
from shardfeed.pipeline.samplers import (
    EpochContext,
    Sample,
    SampleKey,
    Transform,
    bind_transform,
    record_sample,
)
from shardfeed.sampling.keys import MIXTURE, sample_rng

_NEEDS = "a Mixture source must be a shardfeed.Dataset, another DataSource, or a Subset of one"


@dataclass(frozen=True, slots=True)
class Subset:
    """Records ``indices`` of ``data`` (any DataSource), as a source of a :class:`Mixture`.

    ``indices`` are record ids of ``data`` (each at most once); the subset's record ``i`` is
    ``data``'s record ``indices[i]``.
    """

    data: Any
    indices: Any

    def checked(self) -> tuple[DataSource, np.ndarray]:
        data = check_data_source(self.data, needs=_NEEDS)
        ids = np.asarray(self.indices)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"Subset indices must be a 1-d array of record ids, got {ids.dtype} "
                            f"{ids.shape}")
        ids = ids.astype(np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(data)):
            raise ValueError(f"Subset indices must be record ids in [0, {len(data)}); got "
                             f"{int(ids.min())}..{int(ids.max())}")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("Subset indices repeat a record: each record may appear once")
        ids.flags.writeable = False
        return data, ids


@dataclass(frozen=True, slots=True)
class _Source:
    data: DataSource
    ids: np.ndarray | None  # a subset's record ids in data; None: all of data
    fingerprint: str

    def __len__(self) -> int:
        return len(self.data) if self.ids is None else len(self.ids)

    def record(self, local: int) -> int:
        """The id in ``data`` of the source's record ``local``."""
        return local if self.ids is None else int(self.ids[local])


def _source(item: object) -> _Source:
    if isinstance(item, Subset):
        data, ids = item.checked()
        digest = hashlib.blake2b(ids.tobytes(), digest_size=8).hexdigest()
        return _Source(data, ids, f"{data.fingerprint}[subset {len(ids)}:{digest}]")
    data = check_data_source(item, needs=_NEEDS)
    return _Source(data, None, data.fingerprint)


def _weights(weights: Sequence[float] | None, count: int) -> tuple[float, ...]:
    if weights is None:
        return (1.0 / count,) * count
    values = [float(w) for w in weights]
    if len(values) != count:
        raise ValueError(f"weights has {len(values)} values for {count} sources: one each")
    if not all(math.isfinite(w) and w > 0 for w in values):
        raise ValueError(f"weights must be positive and finite, got {values}; leave a source "
                         "out rather than give it weight 0")
    total = math.fsum(values)
    return tuple(w / total for w in values)


def split_counts(n: int, weights: Sequence[float]) -> np.ndarray:
    """``n`` split in proportion to ``weights`` (summing to 1) by largest remainder: each
    count is ``floor(n w)`` or one more, and they sum to ``n``: the spare outputs go to the
    largest remainders ``n w - floor(n w)``, ties to the first source.

    Remainders are compared rounded to 1e-9, so float noise does not break a tie (28 x
    [0.45, 0.35, 0.2] leaves .6, .8 and .6: the spares go to the second and the first)."""
    exact = np.asarray(weights, dtype=np.float64) * n
    counts = np.floor(exact).astype(np.int64)
    short = n - int(counts.sum())
    if short > 0:
        remainders = np.round(exact - counts, 9)
        counts[np.argsort(-remainders, kind="stable")[:short]] += 1
    return counts


def _warn_unseen(counts: np.ndarray, weights: Sequence[float], sizes: Sequence[int]) -> None:
    """Warn once, naming them, when sources get no output in any epoch: a weight too small
    for the epoch (``n w < 1``, and the largest remainders went to others)."""
    unseen = [k for k, c in enumerate(counts.tolist()) if c == 0]
    if not unseen:
        return
    n = int(counts.sum())
    named = "; ".join(
        f"source {k} ({sizes[k]} records, weight {weights[k]:.3g}): {n * weights[k]:.3g} "
        f"expected an epoch, 0 given" for k in unseen[:5])
    need = max(math.ceil(1 / weights[k] - 1e-9) for k in unseen)
    more = f" (and {len(unseen) - 5} more)" if len(unseen) > 5 else ""
    # stacklevel 4: this function, _setup, __init__ or balanced, the caller
    warnings.warn(
        f"Mixture of {len(counts)} sources, {n} outputs an epoch: {named}{more}. Each epoch "
        f"holds exactly its rounded share of every source, so these never appear; pass "
        f"epoch_size={need} or more, raise their weights, or leave them out", stacklevel=4)


class Mixture:
    """Outputs drawn from several sources in stated proportions; a Loader source.

    ``sources``: Datasets, other DataSources or :class:`Subset` s, holding the same features.
    ``weights``: one positive number a source (normalised; default equal). ``epoch_size``:
    outputs an epoch (default: the largest epoch in which every source's share fits in one
    pass over it; a source left with no output warns). ``source_key``: also put the source's number (int64) in every sample under
    this key. See the module docstring for the exact construction.
    """

    kind = "mixture"
    accepts_out = True
    classes: list[Any] | None = None
    """The class of each source, for :meth:`balanced` mixtures (else None)."""

    def __init__(self, sources: Sequence[Any], weights: Sequence[float] | None = None, *,
                 epoch_size: int | None = None, source_key: str | None = None) -> None:
        self._setup(sources, weights, epoch_size, source_key)

    def _setup(self, sources: Sequence[Any], weights: Sequence[float] | None,
               epoch_size: int | None, source_key: str | None) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not sources:
            raise TypeError("sources must be a non-empty list of Datasets, DataSources or "
                            f"Subsets, got {sources!r}")
        self._sources = [_source(s) for s in sources]
        self.source_key = source_key
        if any(len(s) == 0 for s in self._sources):
            empty = [k for k, s in enumerate(self._sources) if len(s) == 0]
            raise ValueError(f"source(s) {empty} of the mixture hold no records")
        self.weights = _weights(weights, len(self._sources))
        self.epoch_size = self._epoch_size(epoch_size)
        self.counts = split_counts(self.epoch_size, self.weights)
        _warn_unseen(self.counts, self.weights, self.source_sizes)
        self._starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        self._offsets = np.concatenate(
            [[0], np.cumsum([len(s) for s in self._sources])]).astype(np.int64)
        self._check_schemas()
        self._perms: dict[tuple[int, int, int, int, bool], np.ndarray] = {}
        self._lock = threading.Lock()

    @classmethod
    def balanced(cls, dataset: Any, labels: Any, *, weights: Mapping[Any, float] | None = None,
                 epoch_size: int | None = None, source_key: str | None = None) -> Mixture:
        """A mixture of ``dataset``'s classes: ``labels`` gives each record's class (one value
        a record, stored order); each class is a source, equally likely unless ``weights``
        (class -> weight) says otherwise. :attr:`classes` lists them in source order.
        ``epoch_size`` defaults to the dataset's length (not :class:`Mixture`'s one-pass
        default, which the rarest class would cut to a few outputs an epoch)."""
        values = np.asarray(labels)
        if values.ndim != 1 or len(values) != len(dataset):
            raise ValueError(f"labels must hold one class a record: {len(dataset)} values for "
                             f"this dataset, got shape {values.shape}")
        classes, codes = np.unique(values, return_inverse=True)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(classes) + 1))
        subsets = [Subset(dataset, order[bounds[k]:bounds[k + 1]]) for k in range(len(classes))]
        chosen = None
        if weights is not None:
            missing = [c for c in classes.tolist() if c not in weights]
            if missing:
                raise ValueError(f"weights gives no weight for class(es) {missing[:10]}")
            chosen = [weights[c] for c in classes.tolist()]
        if epoch_size is None:  # an epoch as long as the dataset, as WeightedRandomSampler's
            epoch_size = max(1, len(values))
        mixture = cls.__new__(cls)
        mixture._setup(subsets, chosen, epoch_size, source_key)
        mixture.classes = classes.tolist()
        return mixture

    def _epoch_size(self, epoch_size: int | None) -> int:
        if epoch_size is None:
            fits = min(len(s) / w for s, w in zip(self._sources, self.weights))
            size = math.floor(fits * (1 + 1e-12))  # 0.7 * 1000 / 0.7 may land a hair below
            return max(size, 1)
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) \
                or epoch_size < 1:
            raise ValueError(f"epoch_size must be a positive int, got {epoch_size!r}")
        return int(epoch_size)

    def _check_schemas(self) -> None:
        known = [(k, s.data.schema) for k, s in enumerate(self._sources)
                 if s.data.schema is not None]
        for k, schema in known[1:]:
            first, base = known[0]
            assert schema is not None and base is not None
            if set(schema.features) != set(base.features):
                differ = sorted(set(schema.features) ^ set(base.features))
                raise SchemaError(
                    f"sources {first} and {k} of the mixture hold different features "
                    f"({differ[:8]}): a mixture's sources must hold the same features; pack "
                    "them alike")

    @property
    def source_sizes(self) -> list[int]:
        """Records of each source, in order."""
        return [len(s) for s in self._sources]

    # -- the sampler contract (pipeline/samplers.py) -----------------------------------------

    @property
    def num_units(self) -> int:
        return self.epoch_size

    def samples_per_epoch(self, num_units: int) -> int:
        return num_units

    def bind(self, transform: Callable[..., Sample] | None) -> Transform | None:
        data = self._sources[0].data
        return bind_transform(transform, data.schema, data.root)

    def sources_of(self, ctx: EpochContext, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position: its source number and the record id within that source."""
        slots = np.asarray(ctx.order[np.asarray(positions, dtype=np.int64)], dtype=np.int64)
        sources = np.searchsorted(self._starts, slots, side="right") - 1
        local = np.empty(len(slots), dtype=np.int64)
        for s in np.unique(sources).tolist():
            rows = np.flatnonzero(sources == s)
            j = slots[rows] - self._starts[s]
            size = len(self._sources[s])
            for k in np.unique(j // size).tolist():
                pick = rows[j // size == k]
                perm = self._permutation(ctx, s, k)
                local[pick] = perm[(slots[pick] - self._starts[s]) % size]
        return sources, local

    def single_records(self, ctx: EpochContext, positions: np.ndarray) -> np.ndarray:
        """The record id (over all sources, one after another) of each position."""
        sources, local = self.sources_of(ctx, positions)
        records: np.ndarray = self._offsets[sources] + local
        return records

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        return [(r,) for r in self.single_records(ctx, positions).tolist()]

    def _permutation(self, ctx: EpochContext, source: int, k: int) -> np.ndarray:
        key = (ctx.seed, ctx.epoch, source, k, ctx.order.shuffle)
        perm = self._perms.get(key)
        if perm is not None:
            return perm
        size = len(self._sources[source])
        perm = np.arange(size, dtype=np.int32 if size < 2**31 else np.int64)
        if ctx.order.shuffle:
            sample_rng(ctx.seed, ctx.epoch, (source << 32) | k, MIXTURE).shuffle(perm)
        perm.flags.writeable = False
        with self._lock:
            if len(self._perms) > 4 * len(self._sources):  # keep the epochs in use only
                for old in [old for old in self._perms if old[1] != ctx.epoch]:
                    del self._perms[old]
            self._perms[key] = perm
        return perm

    def _split(self, record: int) -> tuple[int, int]:
        s = int(np.searchsorted(self._offsets, record, side="right")) - 1
        return s, record - int(self._offsets[s])

    def read(self, records: Sequence[int]) -> list[Sample]:
        ids = np.asarray(records, dtype=np.int64)
        sources = np.searchsorted(self._offsets, ids, side="right") - 1
        out: list[Sample] = [{}] * len(ids)
        by_data: dict[int, list[tuple[int, int]]] = {}  # one read per underlying data source
        for row, (s, r) in enumerate(zip(sources.tolist(), ids.tolist())):
            source = self._sources[s]
            stored = source.record(r - int(self._offsets[s]))
            by_data.setdefault(id(source.data), []).append((row, stored))
        datas = {id(s.data): s.data for s in self._sources}
        for key, rows in by_data.items():
            read = datas[key].read_many([stored for _, stored in rows])
            for (row, _), record in zip(rows, read):
                out[row] = record
        if self.source_key is not None:
            out = [{**record, self.source_key: np.int64(s)}
                   for record, s in zip(out, sources.tolist())]
        return out

    def make_sample(self, key: SampleKey, record_ids: Sequence[int], records: Sequence[Sample],
                    transform: Transform | None, *,
                    out: Mapping[str, np.ndarray] | None = None) -> Sample:
        return record_sample(key, records[0], transform, out)

    def locate(self, record: int) -> tuple[str, int, int]:
        s, local = self._split(record)
        source = self._sources[s]
        return source.data.locate(source.record(local))

    def feature_lengths(self) -> Mapping[str, int | None]:
        lengths: dict[str, int | None] = {}
        for source in self._sources:
            schema = source.data.schema
            for name, info in ({} if schema is None else schema.features).items():
                lengths[name] = info.length if lengths.get(name, info.length) == info.length \
                    else None
        return lengths

    @property
    def index_bytes(self) -> int:
        subsets = sum(0 if s.ids is None else s.ids.nbytes for s in self._sources)
        return 8 * (int(self._offsets[-1]) + len(self._sources)) + subsets

    def state(self) -> dict[str, Any]:
        return {"kind": self.kind, "records": [len(s) for s in self._sources],
                "dataset": [s.fingerprint for s in self._sources],
                "weights": list(self.weights), "epoch_size": self.epoch_size}

    def restore(self, state: Mapping[str, Any]) -> None:
        check_sampler_state(state, self.state(), sampler="Mixture")

    def __getstate__(self) -> dict[str, Any]:
        # Process workers only call make_sample: leave the sources (open files) behind.
        return {"source_key": self.source_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source_key = state["source_key"]

    def __repr__(self) -> str:
        shares = ", ".join(f"{w:.3g}" for w in self.weights)
        return (f"Mixture({len(self._sources)} sources, weights=[{shares}], "
                f"epoch_size={self.epoch_size})")
