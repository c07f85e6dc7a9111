"""The Loader: shuffled, transformed, batched samples from a data source, with a tiny state.

Determinism: the sample at global epoch position ``p`` is ``sampler.make_sample`` of unit
``EpochOrder(seed, epoch)[p]`` with randomness from ``sample_rng(seed, epoch, p)``; this rank
takes positions ``RankShare(total, rank, world_size, start=consumed, remainder=...)``.
Nothing depends on the number of threads or processes, the prefetch depth or timing.

Ranks (``rank``/``world_size`` None: detected, see :mod:`shardfeed.pipeline.ranks`)::

    epoch positions   0  1  2  3  4  5  6  7  8  9  10 11 12 13      total = 14, W = 4
    ranks             r0 r1 r2 r3 r0 r1 r2 r3 r0 r1 r2 r3 r0 r1
    remainder="drop"  each rank 3 samples; positions 12, 13 are not visited this epoch
    remainder="pad"   each rank 4 samples; r2, r3 take positions 14, 15 = 0, 1 again

State: ``{"seed", "epoch", "consumed", "skipped", "shuffle", "order_method", "source"}`` —
``consumed`` is the prefix of the epoch's positions that all ranks together have received
(``min(total, start + steps·W)``), identical on every rank after the same number of batches;
it restores on any world size and any number of threads. ``restore`` refuses a state whose
seed, order or source fingerprint (dataset, window or patch options) is not this loader's
(:mod:`shardfeed.pipeline.loader_state`). Memory: see :meth:`Loader.memory_budget`.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardfeed.errors import TooManyErrorsError
from shardfeed.pipeline import stage_stats
from shardfeed.pipeline.batch_stage import (
    BatchStage,
    as_stages,
    restore_stages,
    save_stages,
    slice_threads_of,
    stage_memory_bytes,
)
from shardfeed.pipeline.batching import BatchLayout, SharedBatchRing
from shardfeed.pipeline.concurrency import SliceGate
from shardfeed.pipeline.epoch import EpochRun, HandOut
from shardfeed.pipeline.executor import CpuPool
from shardfeed.pipeline.loader_state import (
    STATE_KEYS,
    across_versions,
    check_state,
    run_of,
    state_to_json,
)
from shardfeed.pipeline.memory import (
    MemoryBudget,
    batch_bytes,
    decode_bytes_per_thread,
    loader_budget,
    payload_bytes,
)
from shardfeed.pipeline.options import (
    COPY_DEPRECATED,
    ErrorPolicy,
    LoaderOptions,
    OnError,
    OrderMethod,
    Remainder,
    Workers,
    empty_share_message,
)
from shardfeed.pipeline.pool import (
    BatchRing,
    batches_in_flight,
    open_ring,
    release,
    ring_batches,
    thread_pool,
)
from shardfeed.pipeline.produce import SliceBuilder
from shardfeed.pipeline.progress import Progress
from shardfeed.pipeline.ranks import RankInfo, announce_share, resolve_ranks
from shardfeed.pipeline.read_ahead import Carry, read_ahead_for, staging_bytes
from shardfeed.pipeline.run_ahead import RunAhead, ahead_depth
from shardfeed.pipeline.samplers import DATA_ERRORS, EpochContext, Sample, Sampler, as_sampler
from shardfeed.pipeline.stage_clocks import ConsumerClock, Timed
from shardfeed.pipeline.stage_stats import LoaderStats, StageFigures, StatsWindow, snapshot
from shardfeed.pipeline.stats_report import StatsReport
from shardfeed.pipeline.step_records import StepRecords, records_at, where_record
from shardfeed.pipeline.thread_budget import ThreadBudget, thread_budget
from shardfeed.pipeline.workers import check_payload
from shardfeed.sampling.partition import RankShare
from shardfeed.sampling.permutation import EpochOrder

__all__ = [
    "STATE_KEYS", "Loader", "LoaderStats", "MemoryBudget", "TooManyErrorsError", "state_to_json",
]

class Loader:
    """Batches of samples from a Dataset or any DataSource (or Windows / Patches over one), in
    parallel. ``data`` is read through a sampler (:mod:`shardfeed.pipeline.samplers`): one
    sample a record, or ``Windows`` / ``Patches`` as given; a new input format implements
    :class:`~shardfeed.dataset.data_source.DataSource` (see ``docs/extending.md``).

    ::

        loader = Loader(ds, batch_size=256, shuffle=True, seed=0,
                        transform=presets.train(size=224), num_threads=8)
        for epoch in range(90):
            loader.set_epoch(epoch)
            for batch in loader:       # {"image": uint8 (256,224,224,3), "label": (256,), ...}
                ...

    Batches: numeric features become arrays with the batch first ((B,) when the stored length
    is 1), bytes and strings lists. ``transform=None`` gives the parsed features as stored.
    Batches may be kept (in a list, per-batch labels, views, tensors): the large arrays are
    built in a ring of reused buffers, but a buffer is written again only once nothing made
    from its last batch is alive (see :class:`~shardfeed.pipeline.pool.BatchRing`), so a
    training loop that drops each batch reuses them with no copy. ``copy`` is deprecated and
    has no effect. ``prefetch_batches`` are built ahead of the caller, or one a thread where
    they fit in 64 MiB, up to 4 a thread of small ones while slices hold several (see
    :func:`~shardfeed.pipeline.pool.batches_in_flight`).

    Iterating runs the rest of the current epoch; when it completes the loader moves on to the
    next epoch, so ``for batch in loader`` again gives the next epoch. ``set_epoch(e)`` jumps to
    the start of epoch ``e`` (a no-op if ``e`` is the current epoch, so a restored position is
    kept). ``state()`` / ``restore(state)`` save and continue the identical stream.

    Errors: ``on_error="raise"`` stops at a corrupt record or undecodable image with its shard,
    record and byte offset; ``"skip"`` replaces it deterministically (see
    :mod:`shardfeed.pipeline.produce`), counts it in :attr:`stats`, and raises
    :class:`TooManyErrorsError` past ``max_skipped`` (or ``max_skipped_fraction``) an epoch.
    Exceptions from the transform reach the caller unchanged, with a note naming the record.

    Batch stages: ``batch_stages`` (one :class:`~shardfeed.pipeline.batch_stage.BatchStage` or
    a list) run on each whole batch as it is handed out, in order, with the keys its rows were
    made with; their state is part of ``state()`` and ``close()`` closes them (see
    :mod:`shardfeed.pipeline.batch_stage`).

    Read-ahead: on data fetched from object storage, the records of the next batches are
    fetched before their batch is built, several chunks of batches at once (their order is
    known); ``read_ahead`` = batches fetched ahead (None: sized to about 16 MiB a chunk; 0:
    off). With a ``Dataset(..., cache_dir=...)`` smaller than the data, the disk cache keeps
    the records used soonest (see :mod:`shardfeed.pipeline.read_ahead`).

    Workers: ``workers="threads"`` (default; decoders release the GIL; when one thread
    measures faster than all, as on small GIL-bound images, slices are built one at a time:
    :mod:`shardfeed.pipeline.concurrency`; ``adaptive_threads=False`` holds every thread,
    never measuring) or ``"processes"``
    (transforms that hold the GIL; batches are written into shared memory; same bytes).

    Ranks: ``rank``/``world_size`` None detect them (torch.distributed process group, then
    RANK/WORLD_SIZE, then JAX processes, else one rank; :attr:`ranks` says which). Rank r
    of W takes epoch positions ``consumed + r + k·W``: the shares are disjoint and of equal
    length on every rank. ``remainder`` says what happens to the ``n mod W`` positions left
    at the end of an epoch of n samples: ``"drop"`` leaves them out (every sample at most
    once), ``"pad"`` gives each rank one more, the extra positions wrapping to the first
    samples of the epoch (every sample at least once; the repeats are identical samples).
    Default: ``"drop"`` with ``drop_last=True``, else ``"pad"``.

    Resume on another world size: ``state()`` holds the global ``consumed`` (the same on
    every rank after the same number of batches, so rank 0's state is enough; see
    :func:`shardfeed.loaders.distributed.agreed_state`). Restored on W' ranks, the ranks
    split positions ``[consumed, n)`` as above with W': together with what was consumed
    before, ``"drop"`` delivers positions ``[0, n - (n - consumed) mod W')`` each exactly
    once, ``"pad"`` every position at least once (the ``-(n - consumed) mod W'`` extra ones
    are the epoch's first positions again).
    """

    def __init__(
        self,
        data: Any,
        /,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        transform: Any = None,
        num_threads: int = 4,
        prefetch_batches: int = 2,
        drop_last: bool = False,
        on_error: OnError = "raise",
        max_skipped: int | None = None,
        max_skipped_fraction: float = 0.01,
        rank: int | None = None,
        world_size: int | None = None,
        remainder: Remainder | None = None,
        workers: Workers = "threads",
        copy: bool = False,
        order_method: OrderMethod = "exact",
        batch_stages: BatchStage | Sequence[BatchStage] | None = None,
        read_ahead: int | None = None,
        adaptive_threads: bool = True,
    ) -> None:
        self.ranks: RankInfo = resolve_ranks(rank, world_size)
        if copy is True:
            warnings.warn(COPY_DEPRECATED, DeprecationWarning, stacklevel=2)
        if remainder is None:
            remainder = "drop" if drop_last is True else "pad"
        self.options = LoaderOptions(
            batch_size=batch_size, shuffle=shuffle, seed=seed, num_threads=num_threads,
            prefetch_batches=prefetch_batches, drop_last=drop_last,
            rank=self.ranks.rank, world_size=self.ranks.world_size, remainder=remainder,
            workers=workers, copy=copy, order_method=order_method, read_ahead=read_ahead,
            adaptive_threads=adaptive_threads,
        )
        self.policy = ErrorPolicy(
            on_error=on_error, max_skipped=max_skipped, max_skipped_fraction=max_skipped_fraction
        )
        self.sampler: Sampler = as_sampler(data)
        self.batch_stages = as_stages(batch_stages)
        self._transform = self.sampler.bind(transform)
        self._builder = SliceBuilder(self.sampler, self._transform, skip=self.policy.on_error == "skip")
        if self.options.workers == "processes":  # what the processes get must pickle: say so now
            check_payload(self.sampler, self._transform)
        self.num_units = int(self.sampler.num_units)
        self.samples_per_epoch = int(self.sampler.samples_per_epoch(self.num_units))
        per_rank = len(self._share(0))
        announce_share(self.ranks, share=per_rank, total=self.samples_per_epoch)
        if drop_last and per_rank < batch_size:
            warnings.warn(empty_share_message(self.options, per_rank), stacklevel=2)
        self._progress = Progress(
            self.samples_per_epoch, self.options.world_size,
            self.policy.budget(self.samples_per_epoch // self.options.world_size),
        )
        self._gate = SliceGate(
            self.options.num_threads,
            adaptive=self.options.workers == "threads" and self.options.adaptive_threads,
            shares_gil=self.options.workers == "threads",
            window_samples=max(4 * batch_size, 512),
        )
        self._reserved = 0  # batches a consumer keeps alive (reserve_held_batches)
        self._consumer = ConsumerClock()  # the consumer's wait and step (see stats)
        self._report: StatsReport | None = None
        self._first_mark: Any = None  # taken when the first pass begins (see stats)
        self._window = StatsWindow(None, self)  # the window of a plain stats()
        self._open_nothing()

    def _open_nothing(self) -> None:
        """The parts made on first use: batch layout, ring, workers, the epoch run."""
        self._layout: BatchLayout | None = None
        self._probe: tuple[Sample, list[Sample]] | None = None
        self._in_flight = self.options.prefetch_batches  # batches built at once (layout known)
        self._in_flight_single = self._in_flight  # those while slices are within a batch
        self._at_once = self._in_flight  # those of the last pass (one reading ahead: fewer)
        self._ring: BatchRing | None = None
        self._shared: SharedBatchRing | None = None
        self._executor: CpuPool | None = None
        self._processes: Any = None
        self._run: EpochRun | None = None
        self._kept_positions: tuple[tuple[object, ...], np.ndarray] | None = None
        self._ahead: RunAhead | None = None  # the pass made ahead, for a stage that asks
        self._carry: Carry | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, release, [None, None, None])

    @property
    def source(self) -> Sampler:
        """Deprecated: :attr:`sampler` (in shardfeed, a "source" is where bytes and records
        come from: ``open_source``, ``DataSource``, ``source_options``)."""
        warnings.warn("Loader.source is deprecated: use Loader.sampler (the same object)",
                      DeprecationWarning, stacklevel=2)
        return self.sampler

    # -- presets -------------------------------------------------------------------------------

    @classmethod
    def for_train(cls, data: Any, /, *, batch_size: int, **options: Any) -> Loader:
        """A training loader: shuffled, last partial batch dropped (override any option)."""
        options.setdefault("shuffle", True)
        options.setdefault("drop_last", True)
        return cls(data, batch_size=batch_size, **options)

    @classmethod
    def for_eval(cls, data: Any, /, *, batch_size: int, **options: Any) -> Loader:
        """An evaluation loader: dataset order, last partial batch kept (override any option)."""
        options.setdefault("shuffle", False)
        options.setdefault("drop_last", False)
        return cls(data, batch_size=batch_size, **options)

    # -- epochs and state ------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._progress.epoch

    def stats(self, window: StatsWindow | None = None) -> LoaderStats:
        """The loader's counters and where its time went: over the whole run (``run``) and
        since the previous call (``window``), with a verdict (see
        :mod:`shardfeed.pipeline.stage_stats`). Cheap: call it every few seconds.
        ``window``: measure the window from that mark (:meth:`stats_window`) instead of the
        loader's own, so that readers of the figures do not shorten each other's."""
        if window is None:
            window = self._window
        elif not isinstance(window, StatsWindow) or window.owner() is not self:
            raise TypeError(f"window must come from this loader's stats_window(), got "
                            f"{window!r}")
        p = self._progress
        first = self._first_mark
        if first is None:  # no pass yet: nothing measured
            return LoaderStats(p.epoch, p.skipped, p.skipped_total, p.batches_total)
        now = self._snapshot()
        last = window.mark if window.mark is not None else first
        window.mark = now
        o = self.options
        shape: dict[str, Any] = {
            # the batches the last pass built at once (prefetch_batches or more): the stats'
            # advice starts from them
            "threads": o.num_threads, "prefetch": self._at_once,
            "processes": o.workers == "processes",
            "device_decode": stage_stats.device_decode(self._transform)}
        return LoaderStats(p.epoch, p.skipped, p.skipped_total, p.batches_total,
                           run=StageFigures.between(first, now, **shape),
                           window=StageFigures.between(last, now, **shape))

    def stats_window(self, *, since_start: bool = False) -> StatsWindow:
        """A window of :meth:`stats` of its own, from now (``since_start``: from the first
        pass's start): ``loader.stats(window=w)`` measures since ``w``'s previous call,
        whoever else asks for stats meanwhile."""
        started = self._first_mark is not None
        return StatsWindow(self._snapshot() if started and not since_start else None, self)

    def _start_marks(self) -> None:
        """The run's first mark: the counters when the first pass begins."""
        if self._first_mark is None:
            self._first_mark = self._snapshot()

    def _snapshot(self) -> Any:
        trials = self._gate.stats().off_choice_seconds  # time at a limit not chosen
        datasets = list({id(ds): ds for ds in self._datasets()}.values())  # each once
        return snapshot(self._builder.clock, self._consumer, datasets,
                        self._progress.skipped_total, trials)

    def report(self, every: float | None = 10.0, *, display: bool = True,
               jsonl: str | os.PathLike[str] | None = None) -> None:
        """Report :meth:`stats` while batches are handed out: every ``every`` seconds, a
        one-line display (tqdm; a widget in a notebook) and, with ``jsonl``, one JSON object a
        line appended to that file (the window since the previous report and its verdict).
        ``every=None`` stops reporting. See :mod:`shardfeed.pipeline.stats_report`."""
        if self._report is not None:
            self._report.close()
            self._report = None
        if every is not None:
            self._check_open()
            window = self.stats_window()
            self._report = StatsReport(lambda: self.stats(window), every=every,
                                       display=display, jsonl=jsonl)

    def _tick(self) -> None:
        """After each batch handed out: the report's tick, if one is attached now."""
        report = self._report
        if report is not None:
            report.tick()

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch``; keep the position if it is the current epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 1 << 64:
            raise ValueError(f"epoch must be an int in [0, 2**64), got {epoch!r}")
        self._stop_run()
        self._progress.go_to(epoch)

    def state(self) -> dict[str, Any]:
        """Where the stream stands, after the batches handed out so far (JSON-serialisable).

        With batch stages, their states too (``"batch_stages"``, one a stage, in order).
        ``"run"``: this loader's batch size, ranks, ``drop_last`` and ``remainder``, which decide
        what each step's batches hold (``shardfeed which`` reads them); the state restores on a
        loader with other ones.
        """
        epoch, consumed, skipped = (self._ahead.handed if self._ahead is not None else
                                    (self._progress.epoch, self._progress.consumed,
                                     self._progress.skipped))
        state: dict[str, Any] = {
            "seed": self.options.seed,
            "epoch": epoch,
            "consumed": consumed,
            "skipped": skipped,
            "shuffle": self.options.shuffle,
            "order_method": self.options.order_method,
            "source": self.sampler.state(),
            "run": run_of(self.options),
        }
        if self.batch_stages:
            state["batch_stages"] = save_stages(self.batch_stages)
        return state

    def restore(self, state: Mapping[str, Any], *, to_latest: bool = False) -> None:
        """Continue the stream that ``state`` was saved from (any thread or rank count).

        ``to_latest``: a state saved at an epoch's end on an earlier version of this loader's
        dataset (before ``pack --append`` made the version it reads) goes on with the next
        epoch, an exact permutation of this version's records; a state in the middle of an
        epoch is refused (finish that epoch on ``Dataset(folder, version=k)``). A state of
        this version restores as without it.

        Raises StateError, changing nothing, when the state is not one this loader can
        continue (another seed, order, dataset or source options, other batch stages;
        counters out of range).
        """
        opts = self.options
        saved_stages = state.get("batch_stages") if isinstance(state, Mapping) else None
        if isinstance(state, Mapping):
            state = {k: v for k, v in state.items() if k != "batch_stages"}
            state = self._across_versions(state, to_latest=to_latest)
        state = check_state(
            state, seed=opts.seed, samples_per_epoch=self.samples_per_epoch,
            shuffle=opts.shuffle, order_method=opts.order_method,
        )
        restore_stages(self.batch_stages, saved_stages,
                       then=lambda: self.sampler.restore(state["source"]))
        self._stop_run()
        progress = self._progress
        progress.epoch = int(state["epoch"])
        progress.consumed = int(state["consumed"])
        progress.skipped = int(state["skipped"])

    def _across_versions(self, state: dict[str, Any], *, to_latest: bool) -> dict[str, Any]:
        """``state`` as :func:`across_versions` takes it where it was saved on another version
        of this loader's dataset (found by its fingerprint among the versions the dataset
        keeps); else as it is (the checks that follow name what differs)."""
        saved, own = state.get("source"), self.sampler.state()
        if not isinstance(saved, Mapping) or not isinstance(saved.get("dataset"), str) or (
                saved.get("dataset") == own.get("dataset")):
            return state
        datasets = self._datasets()
        version_with = getattr(datasets[0], "version_with", None) if len(datasets) == 1 else None
        found = version_with(saved["dataset"]) if version_with is not None else None
        if found is None or datasets[0].version is None:
            return state
        return across_versions(state, own, saved=found, own=int(datasets[0].version),
                               to_latest=to_latest)

    # -- sizes -----------------------------------------------------------------------------------

    def _share(self, epoch_start: int) -> RankShare:
        opts = self.options
        return RankShare(
            self.samples_per_epoch, rank=opts.rank, world_size=opts.world_size,
            start=epoch_start, remainder=opts.remainder,
        )

    def _positions(self, epoch_start: int) -> np.ndarray:
        """This rank's positions of an epoch from ``epoch_start`` on (read-only). The last
        asked are kept: each epoch's pass from its start asks for the same ones (60,000
        records: 480 KB, whose new pages cost about 0.4 ms a pass)."""
        opts = self.options
        asked = (epoch_start, self.samples_per_epoch, opts.rank, opts.world_size,
                 opts.remainder)
        kept = self._kept_positions
        if kept is not None and kept[0] == asked:
            return kept[1]
        share = self._share(epoch_start)
        positions = np.asarray(share[0 : len(share)], dtype=np.int64)
        positions.flags.writeable = False
        self._kept_positions = (asked, positions)
        return positions

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank."""
        count = len(self._share(0))
        bs = self.options.batch_size
        return count // bs if self.options.drop_last else -(-count // bs)

    def _context(self, epoch: int | None = None) -> EpochContext:
        opts = self.options
        epoch = self._progress.epoch if epoch is None else epoch
        order = EpochOrder(
            self.num_units, seed=opts.seed, epoch=epoch, shuffle=opts.shuffle,
            method=opts.order_method,
        )
        return EpochContext(opts.seed, epoch, order, self.samples_per_epoch)

    def _ensure_layout(self, ctx: EpochContext, position: int) -> BatchLayout:
        if self._layout is None:
            ids = self.sampler.plan(ctx, np.array([position], dtype=np.int64))[0]
            records: list[Sample] = []
            with contextlib.suppress(*DATA_ERRORS):  # a bad first record: its size is unknown
                by_id = self._builder.read(ids)
                records = [by_id[int(i)] for i in ids]
            sample, _ = self._builder.sample_at(ctx, position)
            self._probe = (sample, records)
            # slices of many threads are enlarged within a bound of record bytes (not where
            # the first record could not be read: its size is unknown)
            self._gate.sample_bytes = (sum(payload_bytes(r) for r in records) if records
                                       else None)
            self._layout = BatchLayout.infer(
                sample, batch_size=self.options.batch_size, lengths=self.sampler.feature_lengths()
            )
            # small batches and many threads: more batches at once, for larger slices
            room = getattr(self.sampler, "room_in_flight", None)
            made = batch_bytes(self._layout, sample)
            self._in_flight = batches_in_flight(self.options, made, room_in_flight=room)
            # while slices are within a batch (a trial's, heavy work): one a thread
            self._in_flight_single = batches_in_flight(self.options, made, room_in_flight=room,
                                                       several=False)
        return self._layout

    def batch_layout(self) -> tuple[BatchLayout, Sample]:
        """The keys of every batch and how each is stored, with the first sample they were
        learned from (built once, before any batch; the batch stages' output is not in it).
        Framework adapters derive their tensor specs from this."""
        self._check_open()
        layout = self._ensure_layout(self._context(), 0)
        assert self._probe is not None
        return layout, self._probe[0]

    def reserve_held_batches(self, held: int) -> None:
        """Say that the consumer keeps up to ``held`` batches alive besides the one it uses.

        For framework adapters whose prefetch buffer holds the batches' memory (a
        ``tf.data`` prefetch over tensors made without a copy): the loader's ring grows by up
        to ``held`` buffers, counted in ``memory_budget().ring_batches``, and builds in them
        again once the consumer lets go. Without it, every batch the consumer still holds
        when its buffer comes round is left to the consumer and the next batch is built in
        new memory: correct, but an allocation of the whole batch (and its page faults)
        every batch. With ``workers="processes"`` the ring never grows: held batches are
        handed out as copies instead. Calls take the largest ``held`` said.
        """
        if isinstance(held, bool) or not isinstance(held, int) or held < 0:
            raise ValueError(f"held must be an int >= 0 (batches), got {held!r}")
        self._reserved = max(self._reserved, held)
        if self._ring is not None:
            self._ring.reserve(self._reserved)

    @property
    def transform(self) -> Any:
        """The transform the loader applies (bound to the dataset's schema), or None."""
        return self._transform

    def records_at(self, step: int, *, rank: int | None = None,
                   after: tuple[Mapping[str, Any], int] | None = None) -> StepRecords:
        """Which records the batch of ``step`` held, on every rank (or ``rank``): for each
        sample its row, epoch position, shard, record in shard, byte offset and small
        features (labels, file name); a window's every frame, a patch's image and box, a
        mixture's dataset, and a bad sample's replacement (``on_error="skip"``). Steps
        count each rank's batches from the run's start; after a restore that changed the
        batch size or ranks, pass ``after=(that state, its step)``. Computed (the work of
        one batch), so any step, past or future; see :mod:`shardfeed.pipeline.step_records`.
        """
        return records_at(self, step, rank=rank, after=after)

    def where_record(self, record: int, epoch: int) -> list[tuple[int, int, int]]:
        """The ``(step, rank, row)`` at which ``record`` is in epoch ``epoch``'s batches: a
        loader over records, over windows (every window with it among its frames) or patches
        (every patch cut from the image); steps counted from the run's start; empty where a
        dropped remainder leaves it out."""
        return where_record(self, record, epoch)

    def thread_budget(self) -> ThreadBudget:
        """Every pool this loader may run threads (or worker processes) in, with the most each
        runs and those it runs now: the loader's own, its datasets', and the process's
        shared pools (see :mod:`shardfeed.pipeline.thread_budget`); ``print`` it for a
        table."""
        return thread_budget(
            num_threads=self.options.num_threads, workers=self.options.workers,
            executor=self._executor, processes=self._processes,
            run_ahead=self._ahead is not None, datasets=self._datasets())

    def _datasets(self) -> list[Any]:
        """The datasets the sampler reads (a mixture's several)."""
        mixed = getattr(self.sampler, "_sources", None)
        if mixed is not None:
            return [source.data for source in mixed]
        get = getattr(self.sampler, "_ds", None)
        if get is None:  # windows: the dataset their frames are read from
            data = getattr(self.sampler, "dataset", None)
            return [data] if data is not None else []
        with contextlib.suppress(Exception):  # a sampler copy without its data source
            return [get()]
        return []

    def memory_budget(self) -> MemoryBudget:
        """The most memory the loader holds, by part; builds one sample to learn its size."""
        self._check_open()
        if self._layout is None:
            self._ensure_layout(self._context(), 0)
        assert self._layout is not None and self._probe is not None
        sample, records = self._probe
        return loader_budget(
            self.options, self._layout, sample, records,
            index_bytes=self.sampler.index_bytes, num_units=self.num_units,
            decode_bytes=decode_bytes_per_thread(self._transform, self.sampler, records),
            cache_bytes=self._cache_bound(),
            ring_batches=ring_batches(self.options, self._reserved, self._in_flight),
            in_flight=self._in_flight,
            stage_bytes=stage_memory_bytes(self.batch_stages),
            read_ahead_bytes=staging_bytes(self.sampler, self._context(), self._positions(0),
                                           option=self.options.read_ahead,
                                           batch_size=self.options.batch_size),
        )

    def _cache_bound(self) -> int:
        """The sampler's cache bound in bytes (``cache_bytes``; 0 for samplers without one).

        A bound derived from the first cached image is unknown until an image was decoded
        (and again after a restore cleared the cache): the probe sample is then built again,
        which decodes one image through the cache.
        """
        if not hasattr(self.sampler, "cache_bytes"):
            return 0
        bound = self.sampler.cache_bytes
        if bound is None and getattr(self.sampler, "cache", None) is not None:
            with contextlib.suppress(*DATA_ERRORS):
                self._builder.sample_at(self._context(), 0)
            bound = self.sampler.cache_bytes
        return int(bound or 0)

    @property
    def memory_bound_bytes(self) -> int:
        """:meth:`memory_budget` in one number of bytes."""
        return self.memory_budget().total_bytes

    # -- iteration -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Loader is closed; create a new one to read again")

    def _resources(self, layout: BatchLayout) -> tuple[BatchRing, Any]:
        opts = self.options
        if self._executor is None:
            gate = self._gate  # not self: the pool is in the loader's finalizer
            self._executor = thread_pool(opts, limit=lambda: gate.limit)
        if self._ring is None:
            self._ring, self._processes, self._shared = open_ring(self._builder, layout, opts,
                                                                     self._in_flight)
            self._ring.reserve(self._reserved)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(
                self, release, [self._executor, self._processes, self._shared]
            )
        build = self._processes.build_slice if self._processes is not None else (
            self._builder.build_slice
        )
        return self._ring, build

    def __iter__(self) -> Iterator[dict[str, Any]]:
        began = time.perf_counter()
        self._check_open()
        self._start_marks()
        self._stop_run()
        opts = self.options
        ctx = self._context()
        begin_pass = getattr(self.sampler, "begin_pass", None)  # optional in the protocol
        if begin_pass is not None:
            begin_pass()
        plan_for_processes = getattr(self.sampler, "plan_for_processes", None)  # optional too
        if plan_for_processes is not None:
            plan_for_processes(opts.workers == "processes")
        positions = self._positions(self._progress.consumed)
        if len(positions):
            layout = self._ensure_layout(ctx, int(positions[0]))
            ring, build = self._resources(layout)
        else:
            ring = BatchRing([], prefetch_batches=opts.prefetch_batches)
            build = self._builder.build_slice
        self._run = EpochRun(
            ctx=ctx, positions=positions, batch_size=opts.batch_size, drop_last=opts.drop_last,
            slice_size=opts.slice_size(), in_flight=self._in_flight,
            in_flight_single=self._in_flight_single, ring=ring,
            executor=self._executor or CpuPool(1),  # no slice to build
            build_slice=build, on_batch=self._progress.commit, gate=self._gate,
            stages=self.batch_stages, clock=self._builder.clock,
        )
        carry, self._carry = self._carry, None
        if carry is not None:
            self._run.adopted = carry.calls
        self._run.read_ahead = read_ahead_for(
            self.sampler, ctx, positions, option=opts.read_ahead, batch_size=opts.batch_size,
            num_batches=self._run.num_batches, carry=carry,
            following=lambda k: (self._context(ctx.epoch + k), self._positions(0), len(self)))
        if self._run.read_ahead is not None:
            self._gate.keep_all_threads()
            # a batch's submit waits for its records' chunk: batches submitted far ahead
            # would hold up the hand-out of those already built
            self._run.in_flight = self._run.in_flight_single = opts.prefetch_batches
        self._at_once = self._run.in_flight
        bound = slice_threads_of(self.batch_stages)
        if bound is not None:
            self._gate.hold(bound)
        handout = HandOut(self._run, closed=lambda: self._closed)
        self._consumer.new_pass(began)
        depth = ahead_depth(self.batch_stages)
        if depth == 0:
            return Timed(handout, self._consumer, self._tick)
        progress, epoch, start = self._progress, ctx.epoch, self._progress.consumed
        self._ahead = RunAhead(
            handout, depth=depth, stages=self.batch_stages,
            counters=lambda: (progress.epoch, progress.consumed, progress.skipped),
            where=lambda k: f"batch {k} of the pass over epoch {epoch} that began at "
                            f"consumed={start} (batch size {opts.batch_size})")
        return Timed(self._ahead, self._consumer, self._tick)

    def add_batch_stage(self, stage: BatchStage, /) -> None:
        """Append ``stage`` to the batch stages (an adapter's own, such as the GPU decode);
        only before the first batch of a pass, so a state never mixes stage lists."""
        self._check_open()
        if self._run is not None and not self._run.closed:
            raise RuntimeError("add_batch_stage: a pass is running; add stages before iterating")
        self.batch_stages = (*self.batch_stages, *as_stages(stage))

    def _stop_run(self) -> None:
        if self._ahead is not None:
            # batches made ahead are dropped: the counters go back to those handed out
            progress = self._progress
            progress.epoch, progress.consumed, progress.skipped = self._ahead.close()
            self._ahead = None
        if self._run is not None:
            self._run.close()
            if self._run.carry is not None:
                self._drop_carry()
                self._carry = self._run.carry
            self._run = None

    def _drop_carry(self) -> None:
        if self._carry is not None:
            self._carry.session.close()
            self._carry = None

    def close(self) -> None:
        """Stop workers and free buffers; idempotent. Iterating afterwards raises. The
        storage calls of the pass in flight end at once (a server that stopped answering
        does not hold it to its deadline)."""
        if self._closed:
            return
        self._closed = True
        if self._run is not None:  # its storage calls end now, not at a dead server's deadline
            self._run.abandon()
        self._stop_run()
        self._drop_carry()
        report, self._report = self._report, None
        if report is not None:
            report.close()  # never raises (see StatsReport)
        registered = self._finalizer.detach()
        if registered is not None:
            release(*registered[2], wait=True)
        self._ring = None
        self._executor = None
        self._processes = None
        self._shared = None
        for stage in self.batch_stages:
            stage.close()

    def __enter__(self) -> Loader:  # noqa: PYI034
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        opts = self.options
        return (f"Loader({type(self.sampler).__name__}, batch_size={opts.batch_size}, "
                f"shuffle={opts.shuffle}, seed={opts.seed}, epoch={self.epoch}, "
                f"consumed={self._progress.consumed}/{self.samples_per_epoch}, "
                f"rank={opts.rank}/{opts.world_size})")
