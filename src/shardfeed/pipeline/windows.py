"""Windows: samples of ``length`` frames of one group (a day of a time-lapse), a Loader sampler.

The window index (:class:`~shardfeed.sampling.windows.WindowIndex`) is built once from the
dataset's per-record group ids and order keys (the manifest's ``groups.npy`` / ``order.npy``
sidecars); the Loader shuffles windows exactly like records (uniform over all windows of all
groups) or reads them in stored order (``shuffle=False``)::

    records   | d0f0 d0f1 d0f2 d0f3 d0f4 | d1f0 d1f1 d1f2 |     length=3, stride=2
    windows   [d0f0 d0f2 d0f4]  (one group; never across the day boundary)
    sample    image (3, H, W, C)   frames stacked on axis 0
              day (3,), timestamp (3,), image/filename [3 names]
              labels (23,)         the last frame's (labels="last")

Every frame is transformed with a fresh generator from the same key, so the random crop,
flip and colour choice is the same for all frames of a window (frames must have one size).

Which features are labels: ``label_keys`` when given; else every numeric feature except the
frames' own keys: ``image``, ``mask``, their stored sizes (``image/height``, ``image/width``,
``image/channels``, ``mask/height``, ``mask/width``) and the dataset's group and order keys. With
``labels="last"`` (default) a label feature comes from the last frame only; with
``labels="all"`` it is stacked like every other feature.

Determinism: window ``order[p]``, frames transformed with ``sample_rng(seed, epoch, p)``.
State: what decides the windows and their samples: the dataset's fingerprint, the number
of records and windows, a digest of every window's frames (it changes with the group and
order sidecars), and the options (length, stride, seconds, labels, label keys); a restore
on other ones raises StateError naming the first that differs. Memory: the window index (4
bytes a window for a fixed stride, ``4·length`` time-based) plus the dataset's index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from shardfeed.dataset.data_source import DataSource, Into, check_data_source
from shardfeed.errors import SchemaError
from shardfeed.format import spec
from shardfeed.pipeline.sampler_state import check_sampler_state
from shardfeed.pipeline.samplers import (
    EpochContext,
    RecordSampler,
    Sample,
    SampleKey,
    Transform,
)
from shardfeed.sampling.windows import ExcludedWindows, WindowIndex

__all__ = ["WindowOptions", "Windows"]

LabelMode = Literal["last", "all"]
LABEL_MODES: tuple[LabelMode, ...] = get_args(LabelMode)
_FRAME_KEYS = frozenset({
    "image", "mask", spec.IMAGE_HEIGHT, spec.IMAGE_WIDTH, spec.IMAGE_CHANNELS, spec.MASK_HEIGHT,
    spec.MASK_WIDTH,
})
_HOW_TO_ADD = (
    "add them when packing (`shardfeed pack --csv-group COLUMN --csv-order COLUMN`) or to "
    "existing TFRecords (`shardfeed index --group-key FEATURE --order-key FEATURE`)"
)


@dataclass(kw_only=True, frozen=True, slots=True)
class WindowOptions:
    """What a window is and which features are labels (see :class:`Windows`)."""

    length: int
    stride: int = 1
    stride_seconds: float | None = None
    tolerance_seconds: float | None = None
    max_gap_seconds: float | None = None
    labels: LabelMode = "last"
    label_keys: Sequence[str] | None = None  # kept as a tuple

    def __post_init__(self) -> None:
        for name in ("length", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}; e.g. length=3, "
                                 "stride=2")
        if self.labels not in LABEL_MODES:
            raise ValueError(f"labels must be one of {LABEL_MODES}, got {self.labels!r}: "
                             "'last' keeps the last frame's labels, 'all' stacks every frame's")
        if self.label_keys is not None:
            keys = self.label_keys
            if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__") or not all(
                isinstance(k, str) for k in keys
            ):
                raise TypeError(f"label_keys must be a sequence of feature names, got "
                                f"{self.label_keys!r}")
            object.__setattr__(self, "label_keys", tuple(self.label_keys))


class Windows:
    """A Loader sampler whose samples are windows of frames within groups.

    ::

        windows = shardfeed.Windows(ds, length=3, stride=2)      # every 2nd frame
        windows = shardfeed.Windows(ds, length=3, stride_seconds=16, max_gap_seconds=30)
        loader = shardfeed.Loader(windows, batch_size=32, shuffle=True, seed=0,
                                  transform=shardfeed.presets.train(size=448))
        # batch["image"]: (32, 3, 448, 448, 3); batch["labels"]: the last frame's

    Options (keyword-only): ``length`` (frames a window), ``stride`` (records between
    frames) or ``stride_seconds`` (time between frames, matched within
    ``tolerance_seconds``, default half of it), ``max_gap_seconds`` (no two consecutive
    frames further apart), ``labels`` (``"last"`` or ``"all"``) and ``label_keys``.
    ``len(windows)`` is the number of valid windows; ``windows.excluded`` counts the anchors
    that gave none, by reason. Raises SchemaError when the dataset has no group ids and no
    order keys (or no order keys for time-based options), saying how to add them.

    Determinism, state and memory: see the module docstring.
    """

    kind = "windows"

    def __init__(
        self,
        dataset: DataSource,
        /,
        *,
        length: int,
        stride: int = 1,
        stride_seconds: float | None = None,
        tolerance_seconds: float | None = None,
        max_gap_seconds: float | None = None,
        labels: LabelMode = "last",
        label_keys: Sequence[str] | None = None,
    ) -> None:
        dataset = check_data_source(
            dataset, needs="Windows needs a shardfeed.Dataset or another shardfeed.DataSource")
        self.options = WindowOptions(
            length=length, stride=stride, stride_seconds=stride_seconds,
            tolerance_seconds=tolerance_seconds, max_gap_seconds=max_gap_seconds,
            labels=labels, label_keys=label_keys,
        )
        groups = dataset.group_ids
        order = dataset.order_keys
        if groups is None and order is None:
            raise SchemaError(
                f"{_describe(dataset)} has no group ids or order keys, so Windows cannot tell "
                f"which frames belong together: {_HOW_TO_ADD}"
            )
        if order is None and (stride_seconds is not None or max_gap_seconds is not None):
            raise SchemaError(
                f"{_describe(dataset)} has no order keys (times), which stride_seconds and "
                f"max_gap_seconds need: {_HOW_TO_ADD}, or use stride= in records"
            )
        self.index = WindowIndex.build(
            groups, order, length=self.options.length, stride=self.options.stride,
            stride_seconds=stride_seconds, tolerance_seconds=tolerance_seconds,
            max_gap_seconds=max_gap_seconds,
        )
        # Frames are records: reading, locating and binding go through a record sampler.
        self._frames = RecordSampler(dataset)
        self._frame_keys = frozenset(
            k for k in (dataset.group_key, dataset.order_key) if k
        ) | _FRAME_KEYS
        self._index_digest: str | None = None

    # -- the Sampler protocol -----------------------------------------------------------------

    @property
    def num_units(self) -> int:
        return len(self.index)

    def __len__(self) -> int:
        """The number of valid windows."""
        return len(self.index)

    @property
    def excluded(self) -> ExcludedWindows:
        """Anchor records that gave no window, by reason (group end, gap, ...)."""
        return self.index.excluded

    def samples_per_epoch(self, num_units: int) -> int:
        return num_units

    def bind(self, transform: Callable[..., Sample] | None) -> Transform | None:
        return self._frames.bind(transform)

    def plan(self, ctx: EpochContext, positions: np.ndarray) -> list[Sequence[int]]:
        units = np.asarray(ctx.order[np.asarray(positions, dtype=np.int64)], dtype=np.int64)
        frames = self.index.frames_many(units)
        return [tuple(row) for row in frames.tolist()]

    def read(self, records: Sequence[int]) -> list[Sample]:
        return self._frames.read(records)

    @property
    def frames_per_sample(self) -> int:
        """Records a sample: every window has ``length`` frames (the batch path's plan)."""
        return self.options.length

    def read_columns(self, records: Sequence[int] | np.ndarray, *,
                     into: Into | None = None) -> dict[str, Any] | None:
        """The frames ``records`` as columns (see :meth:`RecordSampler.read_columns`)."""
        return self._frames.read_columns(records, into=into)

    def stack_columns(self, columns: Mapping[str, Any], samples: int) -> dict[str, Any]:
        """The columns of ``samples`` windows from the transformed columns of their frames
        (``samples × length`` rows, each window's frames in a row): what :meth:`stack` makes
        of each window's frames, a column at a time. A label feature keeps the last frame's
        rows; any other is stacked on a new axis after the window's, a length-1 value a
        frame giving one value a frame (``(samples, length)``), as :meth:`stack` does."""
        k = self.options.length
        take_last = self.options.labels == "last"
        stacked: dict[str, Any] = {}
        for name, column in columns.items():
            if len(column) != samples * k:
                raise SchemaError(f"column {name!r} does not hold {k} frames a window")
            if not isinstance(column, np.ndarray):
                column = list(column)
                if column and _numeric(column[0]):
                    try:  # numbers a frame: stacked as the sample path's np.stack does
                        column = np.stack([np.asarray(v) for v in column])
                    except ValueError:
                        raise SchemaError(f"feature {name!r} has frames of other shapes") from None
            first = column[0]
            if take_last and self.is_label(name, first):
                stacked[name] = column[k - 1 :: k]
            elif isinstance(column, np.ndarray):
                rest = column.shape[1:]
                if not _numeric(first):
                    stacked[name] = [list(column[i * k : (i + 1) * k]) for i in range(samples)]
                    continue
                shape = (samples, k) if rest == (1,) else (samples, k, *rest)
                stacked[name] = column.reshape(shape)
            else:
                stacked[name] = [column[i * k : (i + 1) * k] for i in range(samples)]
        return stacked

    def make_sample(
        self,
        key: SampleKey,
        record_ids: Sequence[int],
        records: Sequence[Sample],
        transform: Transform | None,
    ) -> Sample:
        frames = []
        for record in records:
            frame = dict(record)
            # A fresh generator from the same key: every frame gets the same random choices.
            frames.append(frame if transform is None else transform(frame, key.rng()))
        return self.stack(frames)

    def locate(self, record: int) -> tuple[str, int, int]:
        return self._frames.locate(record)

    def feature_lengths(self) -> Mapping[str, int | None]:
        return self._frames.feature_lengths()

    @property
    def index_bytes(self) -> int:
        return self._frames.index_bytes + self.index.nbytes

    def state(self) -> dict[str, Any]:
        o = self.options
        return {
            # checked in this order: the data, the options, then what both make
            "kind": self.kind, "records": self._frames.num_units,
            "dataset": self._frames.state()["dataset"],
            "length": o.length, "stride": o.stride, "stride_seconds": self.index.stride_seconds,
            "tolerance_seconds": self.index.tolerance_seconds,
            "max_gap_seconds": self.index.max_gap_seconds, "labels": o.labels,
            "label_keys": None if o.label_keys is None else list(o.label_keys),
            "windows": len(self.index), "index": self.index_digest(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        check_sampler_state(state, self.state(), sampler="Windows")

    def index_digest(self) -> str:
        """A digest of every window's frames, in window order (hashed once, on first use)."""
        if self._index_digest is None:
            digest = hashlib.blake2b(digest_size=16)
            chunk = 1 << 16  # windows hashed at a time: bounded memory
            for start in range(0, len(self.index), chunk):
                ws = np.arange(start, min(start + chunk, len(self.index)), dtype=np.int64)
                frames = np.ascontiguousarray(self.index.frames_many(ws), dtype="<i8")
                digest.update(frames.data)
            self._index_digest = digest.hexdigest()
        return self._index_digest

    # -- stacking ------------------------------------------------------------------------------

    def is_label(self, name: str, value: Any) -> bool:
        """Whether feature ``name`` (with this value) is a label (see the module docstring)."""
        keys = self.options.label_keys
        if keys is not None:
            return name in keys
        if name in self._frame_keys:
            return False
        if isinstance(value, np.ndarray):
            return value.dtype.kind in "biuf"
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, bool
        )

    def stack(self, frames: list[Sample]) -> Sample:
        """One window sample from its transformed frames (see the module docstring)."""
        first, last = frames[0], frames[-1]
        for i, frame in enumerate(frames[1:], start=1):
            if frame.keys() != first.keys():
                raise SchemaError(
                    f"frame {i} of a window has features {sorted(frame)}, frame 0 has "
                    f"{sorted(first)}: every frame must have the same features"
                )
        sample: Sample = {}
        take_last = self.options.labels == "last"
        for name, value in last.items():
            if take_last and self.is_label(name, value):
                sample[name] = value
                continue
            values = [frame[name] for frame in frames]
            sample[name] = _stack_values(name, values)
        return sample

    # -- pickling (process workers only call make_sample) ---------------------------------------
    # The record sampler pickles without its data source (open files): nothing more to drop.

    @property
    def dataset(self) -> DataSource | None:
        """The dataset the frames are read from (None in a process worker's copy)."""
        return self._frames.dataset

    def __repr__(self) -> str:
        return f"Windows({self.index!r}, labels={self.options.labels!r})"


def _numeric(value: Any) -> bool:
    """Whether frames holding ``value`` are stacked into an array (a numeric array or number)."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biufc"
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _stack_values(name: str, values: list[Any]) -> Any:
    if not _numeric(values[0]):
        return list(values)
    try:
        stacked = np.stack([np.asarray(v) for v in values])
    except ValueError:
        shapes = sorted({str(np.shape(v)) for v in values})
        raise SchemaError(
            f"feature {name!r} has different shapes in the frames of a window ({', '.join(shapes)})"
            ": frames are stacked, so they need one shape; resize them in the transform (e.g. "
            "presets.train(size=...))"
        ) from None
    if stacked.ndim == 2 and stacked.shape[1] == 1:
        stacked = stacked[:, 0]  # one value a frame (a stored length-1 feature): shape (k,)
    return stacked


def _describe(dataset: DataSource) -> str:
    if len(dataset) == 0:
        return f"the data source {dataset!r}"
    return f"the data source {dataset!r} (record 0 in '{dataset.locate(0)[0]}')"
