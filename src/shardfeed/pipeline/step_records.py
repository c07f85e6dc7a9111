"""Which records a step trained on, computed, not logged: :meth:`Loader.records_at`.

An epoch is a pure function of ``(seed, epoch)`` and the data, and a loader's state is where
its stream stands in it, so the batch of any step, past or future, is found by arithmetic and
the one batch's records read (the work and memory of one batch, whatever the dataset's size)::

    step ──► (epoch, pass start, batch in the pass) ──► each rank's epoch positions
         ──► the sampler's plan (a record, a window's frames, a patch's image)
         ──► the sample built as the loader builds it: a bad record's replacement (skip)
         ──► shard, record in shard, byte offset, and the record's small features

Steps count the batches each rank takes. From the start of a run (``after=None``): step
``s`` is batch ``s % len(loader)`` of epoch ``s // len(loader)``, for a run that kept this
loader's batch size and ranks. After a restore that changed them (an elastic restart): pass
``after=(state, step)``, the state the run restored and the step it was restored at; steps
from it are counted from that state's position with this loader's batch size and ranks (the
rest of the state's epoch, then whole epochs), as the restored loader runs them.

From a saved state without the run's loader: ``shardfeed.records_at``
(:func:`shardfeed.tools.which.records_of_run`). The inverse, :func:`where_record`: the steps, ranks and rows at which a record is in the
batches of an epoch (a record sampler's: its one position; windows and patches use a record
in many samples and are not inverted here).

A Patches loader's image cache is the one its batches use: ask a loader that is not
iterating (or a fresh one) to leave a running pass's cache as it is.

Determinism: the loader's (the same positions, records and replacements as its batches).
State: none. Memory: one batch's records and samples.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardfeed.errors import StateError
from shardfeed.pipeline.loader_state import check_state
from shardfeed.pipeline.samplers import DATA_ERRORS, EpochContext
from shardfeed.sampling.partition import RankShare

SMALL_TEXT = 256
"""Bytes features up to this size that are UTF-8 text are shown (a file name, a key); larger
ones (the image) are not."""
SMALL_ARRAY = 64
"""Numeric features of up to this many values are shown (labels, boxes, ids)."""


@dataclass(frozen=True)
class RecordRef:
    """One record: its id in the loader's source, where it is stored, and its small features
    (numbers as lists, short UTF-8 texts as strings)."""

    record: int
    shard: str
    index: int
    offset: int
    features: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleRecords:
    """One sample of a step's batch: its rank and row, its epoch position, the position whose
    sample the batch held (another where the sample was bad and replaced, ``on_error="skip"``;
    None where it was bad and the loader raises), and its records (a window: every frame, in
    order; a patch: its image). ``box``: a patch's ``(y, x, h, w)`` in the image's full-size
    pixels; ``dataset``: a mixture's source number; ``error``: why the sample was bad."""

    rank: int
    row: int
    position: int
    held: int | None
    records: tuple[RecordRef, ...]
    box: tuple[int, int, int, int] | None = None
    dataset: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class StepRecords:
    """The batch of ``step`` on every rank asked: its epoch, the pass's first epoch position
    (0, or a restored state's), the batch's number in the pass, and its samples."""

    step: int
    epoch: int
    start: int
    batch: int
    samples: tuple[SampleRecords, ...]

    def records(self, rank: int | None = None) -> list[list[int]]:
        """The record ids of each sample held (in row order; one rank's, or every rank's)."""
        return [[r.record for r in s.records] for s in self.samples
                if rank is None or s.rank == rank]

    def to_json(self) -> dict[str, Any]:
        """The batch as a dict of JSON types (``json.dumps`` writes it)."""

        def sample(s: SampleRecords) -> dict[str, Any]:
            return {"rank": s.rank, "row": s.row, "position": s.position, "held": s.held,
                    "box": None if s.box is None else list(s.box), "dataset": s.dataset,
                    "error": s.error,
                    "records": [{"record": r.record, "shard": r.shard, "index": r.index,
                                 "offset": r.offset, "features": r.features}
                                for r in s.records]}

        return {"step": self.step, "epoch": self.epoch, "start": self.start,
                "batch": self.batch, "samples": [sample(s) for s in self.samples]}

    def __str__(self) -> str:
        head = (f"step {self.step}: epoch {self.epoch}, batch {self.batch}" if not self.start
                else f"step {self.step}: epoch {self.epoch}, batch {self.batch} after the "
                     f"restored state's epoch position {self.start}")
        lines = [head]
        for s in self.samples:
            held = ("bad, the loader raises" if s.held is None else
                    "" if s.held == s.position else f"replaced by position {s.held}")
            where = "; ".join(f"{r.shard}#{r.index} @{r.offset} (record {r.record})"
                              f"{_shown(r.features)}"
                              for r in s.records)
            extra = "".join([f" box {list(s.box)}" if s.box is not None else "",
                             f" dataset {s.dataset}" if s.dataset is not None else ""])
            lines.append(f"  rank {s.rank} row {s.row:>3}  position {s.position}"
                         f"{' ' + held if held else ''}{extra}: {where}")
        return "\n".join(lines)


def _shown(features: Mapping[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    return "" if not features else " " + " ".join(f"{k}={value(v)}"
                                                 for k, v in features.items())


def loader_state_of(state: Any) -> dict[str, Any]:
    """A loader state from what a run saved: ``loader.state()`` (or its JSON text, or the path
    of a file holding it), or a Keras ``LoaderCheckpoint``'s ``loader_state.json`` (which
    holds it under ``"loader"``); ValueError naming what it is otherwise. Batch stages'
    states are left out (they decide nothing of which records a step holds)."""
    if isinstance(state, (str, os.PathLike)):
        text = str(state)
        if isinstance(state, str) and text.lstrip().startswith("{"):
            state = json.loads(text)
        else:
            path = Path(text)
            if path.is_dir():
                path = path / "loader_state.json"  # a LoaderCheckpoint's folder
            state = json.loads(path.read_text())
    if isinstance(state, Mapping) and isinstance(state.get("loader"), Mapping) and (
            "seed" not in state):
        saved, state = state, state["loader"]
        if "run" not in state and isinstance(saved.get("run"), Mapping):
            # a LoaderCheckpoint file written before states held "run" kept it beside them
            state = {**state, "run": dict(saved["run"])}
    if not isinstance(state, Mapping) or not {"seed", "epoch", "consumed", "source"} <= set(
            state):
        raise ValueError("a loader state is what loader.state() returns (a dict with 'seed', "
                         "'epoch', 'consumed' and 'source'), its JSON, or a LoaderCheckpoint's "
                         "loader_state.json")
    return {k: v for k, v in state.items() if k != "batch_stages"}


def check_run_state(loader: Any, state: Mapping[str, Any], *, on_step: bool) -> None:
    """StateError unless ``state`` is one of this loader's runs (seed, order, source); with
    ``on_step`` (a run that kept this loader's batch size and ranks from its start), also
    ValueError unless its position falls on a step of them (a run with other ones would give
    other batches)."""
    opts = loader.options
    check_state(state, seed=opts.seed, samples_per_epoch=loader.samples_per_epoch,
                shuffle=opts.shuffle, order_method=opts.order_method)
    saved = json.loads(json.dumps(state["source"]))
    ours = json.loads(json.dumps(loader.sampler.state()))
    if saved != ours:
        differ = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        raise StateError(
            f"the state is of another source than this loader's ({', '.join(differ)} differ: "
            f"the state's {[saved.get(k) for k in differ]}, this loader's "
            f"{[ours.get(k) for k in differ]}): ask with the dataset and the sampler options "
            f"the run used")
    consumed, step = int(state["consumed"]), opts.batch_size * opts.world_size
    if on_step and consumed % step and consumed < loader.samples_per_epoch:
        raise ValueError(
            f"the state stands at epoch position {consumed}, which is not at a step of "
            f"batch_size={opts.batch_size} x world_size={opts.world_size} ({step} samples "
            f"a step): give the run's batch size and number of ranks")


def step_position(loader: Any, step: int, after: tuple[Mapping[str, Any], int] | None
                  ) -> tuple[int, int, int]:
    """``(epoch, pass start, batch in the pass)`` of ``step`` (see the module doc)."""
    if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be an int >= 0 (batches a rank took), got {step!r}")
    epoch, start, first = 0, 0, 0
    if after is not None:
        state, first = loader_state_of(after[0]), after[1]
        if not isinstance(first, (int, np.integer)) or first < 0:
            raise ValueError(f"the state's step must be an int >= 0, got {first!r}")
        check_run_state(loader, state, on_step=False)
        epoch, start = int(state["epoch"]), int(state["consumed"])
        if step < first:
            raise ValueError(
                f"step {step} is before the state's step {first}: steps before a restore are "
                f"counted from the state the run restored then (Python: after=(that state, "
                f"its step); shardfeed which: --state that state --state-step its step), or "
                f"from the run's start for a run that never changed its batch size or ranks "
                f"(after=None; no --state-step)")
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ValueError("an epoch of this loader has no batch: no step holds records")
    k = step - first
    in_pass = _batches(loader, start)
    if k < in_pass:
        return epoch, start, k
    k -= in_pass
    return epoch + 1 + k // per_epoch, 0, k % per_epoch


def _batches(loader: Any, start: int) -> int:
    opts = loader.options
    count = len(RankShare(loader.samples_per_epoch, rank=0, world_size=opts.world_size,
                          start=start, remainder=opts.remainder))
    bs = int(opts.batch_size)
    return count // bs if opts.drop_last else -(-count // bs)


def records_at(loader: Any, step: int, *, rank: int | None = None,
               after: tuple[Mapping[str, Any], int] | None = None) -> StepRecords:
    """The records of ``step``'s batch on rank ``rank`` (None: every rank of the loader's
    world); see :meth:`Loader.records_at`."""
    opts = loader.options
    epoch, start, batch = step_position(loader, step, after)
    ranks = range(opts.world_size) if rank is None else [rank]
    if rank is not None and not 0 <= rank < opts.world_size:
        raise ValueError(f"rank must be in [0, {opts.world_size}), got {rank}")
    ctx = loader._context(epoch)
    builder = loader._builder
    sampler = loader.sampler
    places: list[tuple[int, int, int]] = []  # (rank, row, position)
    for r in ranks:
        share = RankShare(loader.samples_per_epoch, rank=r, world_size=opts.world_size,
                          start=start, remainder=opts.remainder)
        lo = batch * opts.batch_size
        positions = share[lo : min(lo + opts.batch_size, len(share))]
        places += [(r, row, int(p)) for row, p in enumerate(np.asarray(positions).tolist())]
    planned = [[int(i) for i in ids] for ids in sampler.plan(
        ctx, np.array([p for _, _, p in places], dtype=np.int64))]
    wanted = list(dict.fromkeys(i for ids in planned for i in ids))
    try:  # the batch's records in one read; a bad one: each sample read on its own
        read: dict[int, Any] | None = builder.read(wanted)
    except DATA_ERRORS:
        read = None
    shown = _features(sampler, wanted, read)
    samples = [_sample(builder, sampler, ctx, place, ids, read, shown)
               for place, ids in zip(places, planned)]
    return StepRecords(step=step, epoch=epoch, start=start, batch=batch, samples=tuple(samples))


def _sample(builder: Any, sampler: Any, ctx: EpochContext, place: tuple[int, int, int],
            ids: list[int], read: dict[int, Any] | None, shown: dict[int, dict[str, Any]]
            ) -> SampleRecords:
    """One sample as the loader builds it: its position's, or its replacement's."""
    rank, row, position = place
    held: int | None = position
    error = None
    try:
        if read is not None:
            built = builder.make(ctx.key(position), ids, [read[i] for i in ids])
        else:
            built = builder._build_one(ctx, position)
    except DATA_ERRORS as exc:
        error = str(exc).splitlines()[0]
        if builder.skip:
            built, _, held = builder.replacement(ctx, position)
            ids = [int(i) for i in sampler.plan(ctx, np.array([held], dtype=np.int64))[0]]
        else:
            built, held = None, None
    box = None
    if built is not None and "patch/box" in built:
        box = tuple(int(v) for v in np.asarray(built["patch/box"]).tolist())
    dataset = None
    split = getattr(sampler, "_split", None)
    if split is not None:
        dataset = int(split(ids[0])[0])
    missing = [i for i in ids if i not in shown]
    if missing:
        shown.update(_features(sampler, missing, None))
    return SampleRecords(rank=rank, row=row, position=position, held=held,
                         records=tuple(_refs(sampler, ids, shown)), box=box,  # type: ignore[arg-type]
                         dataset=dataset, error=error)


def _features(sampler: Any, ids: list[int], read: dict[int, Any] | None
              ) -> dict[int, dict[str, Any]]:
    """The small features of records ``ids`` (from ``read`` where it holds them)."""
    if read is None or getattr(sampler, "kind", "") == "patches":  # patches: cached markers
        reader = (sampler._ds().read_many if getattr(sampler, "kind", "") == "patches"
                  else sampler.read)
        try:
            return {i: small_features(r) for i, r in zip(ids, reader(ids))}
        except DATA_ERRORS:
            pass
        out: dict[int, dict[str, Any]] = {}
        for i in ids:  # one by one: a damaged record shows nothing, the others their features
            try:
                out[i] = small_features(reader([i])[0])
            except DATA_ERRORS:
                out[i] = {}
        return out
    return {i: small_features(read[i]) for i in ids}


def _refs(sampler: Any, ids: list[int], shown: dict[int, dict[str, Any]]) -> list[RecordRef]:
    out = []
    for record in ids:
        shard, index, offset = sampler.locate(record)
        out.append(RecordRef(record=record, shard=str(shard), index=int(index),
                             offset=int(offset), features=shown.get(record, {})))
    return out


def small_features(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A record's features a person reads, by name: numbers (up to ``SMALL_ARRAY`` values)
    and short UTF-8 texts; not the image or other large values."""
    shown: dict[str, Any] = {}
    for name, value in sorted(sample.items()):
        if name.startswith("__"):
            continue
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            if len(data) <= SMALL_TEXT:
                try:
                    shown[name] = data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
        elif isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
            if sum(len(v) for v in value) <= SMALL_TEXT:
                try:
                    shown[name] = [v.decode("utf-8") for v in value]
                except UnicodeDecodeError:
                    continue
        else:
            array = np.asarray(value)
            if array.dtype.kind in "biuf" and array.size <= SMALL_ARRAY:
                shown[name] = array.tolist()
    return shown


def where_record(loader: Any, record: int, epoch: int) -> list[tuple[int, int, int]]:
    """The ``(step, rank, row)`` at which ``record`` is in epoch ``epoch``'s batches, counted
    from the start of a run that kept this loader's batch size and ranks (see
    :meth:`Loader.where_record`): a record sampler's one sample, a Windows sampler's every
    window with the record among its frames, a Patches sampler's every patch cut from the
    image; empty where the epoch leaves it out (a dropped remainder)."""
    sampler = loader.sampler
    kind = getattr(sampler, "kind", "")
    if kind not in ("records", "windows", "patches"):
        raise ValueError(
            f"where_record inverts a loader over records, windows or patches, not a {kind} "
            f"sampler: ask for the steps you look at (records_at; shardfeed which --step)")
    opts = loader.options
    if not 0 <= record < loader.num_units and kind != "windows":
        raise ValueError(f"record must be in [0, {loader.num_units}), got {record}")
    ctx = loader._context(epoch)
    if kind == "records":
        positions = ctx.order.positions_of([record]).tolist()
    elif kind == "windows":
        windows = sampler.index.windows_with(record)
        positions = ctx.order.positions_of(windows).tolist() if len(windows) else []
    else:  # the outputs cut from the image while it is resident
        q = int(ctx.order.positions_of([record])[0])
        first, last = sampler.schedule.resident_spans(np.array([q]))
        outputs = np.arange(int(first[0]), int(last[0]) + 1, dtype=np.int64)
        outputs = outputs[outputs < ctx.total]
        positions = outputs[sampler.order_positions(ctx.seed, ctx.epoch, outputs) == q].tolist()
    if not positions:
        return []
    found = []
    per_epoch = len(loader)
    for r in range(opts.world_size):
        share = RankShare(loader.samples_per_epoch, rank=r, world_size=opts.world_size,
                          remainder=opts.remainder)
        # share[k] = r + k·W, wrapping past the epoch's end (remainder="pad"), as many times
        # as the ranks' share reaches past it
        wraps = (r + len(share) * opts.world_size) // ctx.total + 1
        for position in positions:
            ks = [(p - r) // opts.world_size
                  for p in (position + m * ctx.total for m in range(wraps))
                  if p >= r and (p - r) % opts.world_size == 0]
            for k in ks:
                if k >= len(share) or int(share[k]) != position:
                    continue
                batch, row = divmod(k, opts.batch_size)
                if batch < per_epoch:
                    found.append((epoch * per_epoch + batch, r, row))
    return sorted(found)


__all__ = ["RecordRef", "SampleRecords", "StepRecords", "records_at", "small_features",
           "step_position", "where_record"]
