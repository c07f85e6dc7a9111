"""Where a Loader's time goes: per-stage accounting, the consumer's wait, and a verdict.

Always on and cheap (a few clock reads a slice and two a batch). Two sides are measured:

- the **pipeline**: every thread that builds slices adds the seconds it spends in each stage
  to accumulators of its own (no lock, no shared counter on the hot path)::

      read       records read: storage (below), framing, CRCs, parsing
      decode     images decoded (the decode op of a transform; Patches' images; the
                 compiled slices of small records, which read and decode in one call)
      transform  the transform's other ops (crops of decoded arrays, jitter, normalising)
      assemble   rows written into the batch, windows stacked, patches cut

  and ``storage``: the seconds the dataset's reads from object storage took (its GETs, by
  whatever thread: a slice's own or a read ahead), the dataset's counters (shared by the
  loaders reading one Dataset).
  ``busy`` is the seconds the threads spent building slices, ``threads`` how many may;
  ``batch_stages`` the seconds an adapter's stages took on whole batches (the GPU decode).
- the **consumer** (the code that iterates the loader, or the adapter's stage over it):
  ``wait``, the seconds it waited inside ``next()`` for a batch, and ``step``, the seconds it
  spent between batches (its training step). ``wait_share`` = wait / (wait + step) is the
  figure that says whether input is the bottleneck.

:class:`StageFigures` holds them for a span of time (the whole run, or the window since the
previous :meth:`Loader.stats` call); :func:`verdict` turns them into one sentence a user can
act on.

Worker processes (``workers="processes"``) build slices in other processes: their stage
seconds are not collected (the consumer's and the storage counters are).

Determinism: none of this changes a batch. State: counters only. Memory: a few floats a
thread.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from shardfeed.pipeline.cores import usable_cores
from shardfeed.pipeline.stage_clocks import (
    BATCH_STAGES,
    BUSY,
    DECODE,
    SLICES,
    STAGES,
    TRANSFORM,
    ConsumerClock,
    StageClock,
)
from shardfeed.transforms.base import Compose
from shardfeed.transforms.decode.device_plan import DevicePlan
from shardfeed.transforms.decode.ops import DecoderBase

QUIET_WAIT = 0.05
"""A consumer that waits less than this share of its time is not held up by its input."""


def device_decode(transform: Any) -> bool:
    """Whether ``transform`` is (or holds) the CPU half of a decode on the GPU."""
    parts = transform.transforms if isinstance(transform, Compose) else (transform,)
    return any(isinstance(p, DevicePlan) for p in parts)


def stage_of(transform: Any) -> int:
    """The stage a transform's time counts to: ``decode`` for a decode op (or a Compose that
    holds one, timed as a whole), ``transform`` for anything else."""
    parts = transform.transforms if isinstance(transform, Compose) else (transform,)
    return DECODE if any(isinstance(p, (DecoderBase, DevicePlan)) for p in parts) else TRANSFORM


@dataclass(frozen=True)
class Snapshot:
    """The counters at one moment (:meth:`StageFigures.between` takes two)."""

    at: float
    clock: tuple[float, ...]
    wait: float
    step: float
    start_wait: float
    batches: int
    samples: int
    storage: dict[str, float]
    skipped: int
    narrowed: float = 0.0  # seconds the slice gate spent trying a limit it had not chosen
    cpu: float = 0.0  # the process's CPU seconds (every thread's; not worker processes')


@dataclass(frozen=True)
class StageFigures:
    """Where a span's time went (see the module doc). Seconds of stages, ``storage`` and
    ``busy`` are thread-seconds (summed over threads); ``seconds``, ``wait`` and ``step`` are
    the wall clock's and the consumer's."""

    seconds: float
    batches: int
    samples: int
    wait: float
    step: float
    stages: dict[str, float]
    storage: float
    busy: float
    threads: int
    slices: int
    requests: int
    bytes_fetched: int
    retries: int
    skipped: int
    cache_hits: int = 0
    start_wait: float = 0.0  # of ``wait``: for the first batch of each pass
    prefetch: int = 0  # batches the loader builds at once (prefetch_batches, or more)
    narrowed: float = 0.0  # seconds the slice gate spent trying a limit it had not chosen
    batch_stages: float = 0.0  # seconds in the batch stages (an adapter's: the GPU decode)
    processes: bool = False  # slices built in worker processes: stage seconds not collected
    device_decode: bool = False  # the transform is the CPU half of a GPU decode
    cores: int = field(default_factory=usable_cores)  # this process's (affinity, CPU quota)
    cpu_seconds: float = 0.0  # the process's CPU seconds over the span, every thread's

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot, *, threads: int, prefetch: int = 0,
                processes: bool = False, device_decode: bool = False) -> StageFigures:
        clock = [y - x for x, y in zip(a.clock, b.clock)]

        def storage(name: str) -> float:
            # a dataset closed meanwhile takes its counters along: never below zero
            return max(0.0, b.storage.get(name, 0.0) - a.storage.get(name, 0.0))

        return cls(
            seconds=b.at - a.at, batches=b.batches - a.batches, samples=b.samples - a.samples,
            wait=b.wait - a.wait, step=b.step - a.step,
            stages={name: clock[k] for k, name in enumerate(STAGES)},
            storage=storage("seconds"), busy=clock[BUSY], threads=threads,
            slices=int(clock[SLICES]), requests=int(storage("requests")),
            bytes_fetched=int(storage("bytes_fetched")), retries=int(storage("retries")),
            cache_hits=int(storage("cache_hits")), skipped=b.skipped - a.skipped,
            start_wait=b.start_wait - a.start_wait, prefetch=prefetch,
            narrowed=b.narrowed - a.narrowed, batch_stages=clock[BATCH_STAGES],
            processes=processes,
            device_decode=device_decode, cpu_seconds=max(0.0, b.cpu - a.cpu))

    @property
    def wait_share(self) -> float:
        """The consumer's share of its time spent waiting for batches (0 when it has none)."""
        total = self.wait + self.step
        return self.wait / total if total > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """The share of the threads' time spent building slices."""
        room = self.threads * self.seconds
        return min(1.0, self.busy / room) if room > 0 else 0.0

    def shares(self) -> dict[str, float]:
        """Each stage's share of the slices' busy time, and ``storage``: the storage calls'
        seconds (on any thread: reads ahead run on their own) against the same time, at most
        1 (it may exceed ``read``, and is not a part of the other shares' sum)."""
        busy = self.busy
        out = {name: (seconds / busy if busy > 0 else 0.0)
               for name, seconds in self.stages.items()}
        # storage calls may run on other threads (reads ahead, Patches' decodes ahead): their
        # seconds against the slices' time, at most all of it
        out["storage"] = min(1.0, self.storage / busy) if busy > 0 else 0.0
        return out

    def verdict(self) -> str:
        return verdict(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: every figure, the shares and the verdict (with worker processes, the
        slices' figures, not measured here, are None)."""
        measured = not self.processes
        return {
            "seconds": self.seconds, "batches": self.batches, "samples": self.samples,
            "slices": self.slices if measured else None,
            "samples_per_s": self.samples_per_s, "wait": self.wait, "step": self.step,
            "wait_share": self.wait_share, "start_wait": self.start_wait,
            "slices_measured": measured,
            "narrowed": self.narrowed, "batch_stages": self.batch_stages,
            "stages": dict(self.stages) if measured else None,
            "storage": self.storage, "busy": self.busy if measured else None,
            "busy_share": self.busy_share if measured else None,
            "threads": self.threads,  "shares": self.shares() if measured else None,
            "cores": self.cores, "cpu_seconds": self.cpu_seconds,
            "built_at_once": self.prefetch,
            "requests": self.requests, "bytes_fetched": self.bytes_fetched,
            "retries": self.retries, "cache_hits": self.cache_hits, "skipped": self.skipped,
            "verdict": self.verdict(),
        }


def verdict(f: StageFigures) -> str:
    """One sentence from the figures: whether the consumer waits for its input, and if so the
    stage that takes most of the pipeline's time and what to try for it."""
    if f.batches == 0:
        return "no batch handed out yet"
    waits = f"the training step waits {f.wait_share:.0%} of its time for data"
    if f.wait_share < QUIET_WAIT:
        return (f"input is not the bottleneck: the training step waits {f.wait_share:.1%} "
                "of its time for data")
    running = (f.wait - f.start_wait) / (f.wait + f.step)
    if running < QUIET_WAIT:
        return (f"{waits}: {f.start_wait / (f.wait + f.step):.0%} for the first batch of "
                f"each pass (made once the pass begins), {running:.1%} while passes run: input "
                "keeps up; longer epochs (or fewer passes) make the start's share smaller")
    shares = f.shares()
    staged = f.batch_stages / f.seconds if f.seconds > 0 else 0.0
    if staged >= 0.5 and staged * f.seconds >= f.busy / max(f.threads, 1):
        return (f"{waits}; the batch stages (the adapter's work on each whole batch: the GPU "
                f"decode, its uploads) take {staged:.0%} of the time, more than the slices' "
                "threads: that stage is the limit (see its own figures: bench/"
                "profile_gpu_path.py for the GPU decode)")
    if f.processes and f.busy <= 0:
        return (f"{waits}; slices are built in worker processes, whose stage times are not "
                "collected: bench the same pipeline with workers='threads' (shardfeed bench) "
                "to see which stage is slow")
    if f.busy <= 0:
        return f"{waits}; no slice was built meanwhile (a pass starting, or batches made ahead)"
    more = _more_threads(f)
    if shares["storage"] >= 0.4:
        return (f"{waits}; waiting on storage takes {shares['storage']:.0%} of the pipeline's "
                f"time ({f.requests:,} requests): keep the records on local disk "
                "(Dataset(url, cache_dir=...)) or read more at once (Dataset(url, "
                "source_options={'max_concurrency': 32}))" + (f", or {more}" if more else ""))
    stage = max(STAGES, key=lambda name: shares[name])
    # more threads than cores: idle threads are not the limit where the process keeps the
    # cores busy (16 threads on 2 cores); its CPU time, not the slices' wall time, which
    # counts threads waiting for the GIL or a core too
    cores_busy = (f.threads > f.cores and f.seconds > 0
                  and f.cpu_seconds / f.seconds >= 0.8 * f.cores)
    if f.busy_share < 0.8 and not cores_busy:
        narrowed = f.narrowed / f.seconds if f.seconds > 0 else 0.0
        per_slice = f.busy / f.slices if f.slices else 0.0
        ahead = (f"for {narrowed:.0%} of the time the loader tried building fewer slices at "
                 "once, measuring whether fewer build faster (a cost that shrinks as a run "
                 "goes on; adaptive_threads=False keeps every thread building)"
                 if narrowed >= 0.1 else
                 f"a slice takes {per_slice * 1e3:.2f} ms: handing slices and batches "
                 "between threads costs more than that work (one process, one GIL): larger "
                 "batches, fewer threads, or workers='processes'"
                 if per_slice < 2e-3 else
                 f"let them make more batches ahead (prefetch_batches={2 * f.prefetch}; "
                 f"{f.prefetch} built at once now)" if 0 < f.prefetch < 8 else
                 "the threads wait on each other or on the GIL (a step that computes in "
                 "Python holds it): workers='processes'")
        return (f"{waits}; the loader's threads are idle {1 - f.busy_share:.0%} of the time "
                f"meanwhile ({words_of(stage)} takes {shares[stage]:.0%} of their work): "
                f"{ahead}")
    decode = (f"use {more}" if more else
              "the GPU decode's CPU half (crops drawn, JPEGs handed on) is the work here: "
              "more cores for it" if f.device_decode else
              "try decode_on='cuda' (the presets)" if _has_gpu() else
              f"every core decodes already ({f.threads} threads, {f.cores} cores): decode fewer "
              "pixels (smaller stored images, a smaller output) or decode on a GPU "
              "(decode_on='cuda')")
    tips = {
        "read": (f"use {more}" if more else
                 "keep the records on local disk (Dataset(url, cache_dir=...))" if f.requests
                 else "reading and parsing the records is the work here: more cores, or "
                      "fewer, larger records"),
        "decode": decode,
        "transform": "make the ops after the decode lighter, or move them to the GPU"
                     + (f", or use {more}" if more else ""),
        "assemble": (f"use {more}" if more else "copying rows into batches is the work here: "
                     "fewer features, or smaller arrays"),
    }
    return (f"{waits}; {words_of(stage)} takes {shares[stage]:.0%} of the pipeline's time: "
            f"{tips[stage]}")


def words_of(stage: str) -> str:
    return {"read": "reading records", "decode": "decoding", "transform": "the transform",
            "assemble": "assembling batches"}[stage]


def _has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (its device files; no CUDA library is loaded)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def _more_threads(f: StageFigures) -> str:
    """Advice to use more threads, where the threads are nearly always busy and the machine
    has cores to spare."""
    if f.busy_share >= 0.8 and f.cores > f.threads:
        return f"more threads (num_threads={min(f.cores, 2 * f.threads)}; this machine has {f.cores} cores)"
    return ""


def snapshot(clock: StageClock, consumer: ConsumerClock, datasets: list[Any],
             skipped: int, narrowed: float = 0.0) -> Snapshot:
    """The counters now: the stage clock's, the consumer's, and the storage counters summed
    over ``datasets`` (their ``storage_stats()``: requests, bytes, retries, seconds, disk
    cache hits)."""
    storage: dict[str, float] = {}
    for ds in datasets:
        stats = getattr(ds, "storage_stats", None)
        if stats is None:
            continue
        try:
            got = stats()
        except Exception:  # noqa: BLE001, S112 - a closed dataset: its counters are gone
            continue
        for key, value in got.items():
            if isinstance(value, (int, float)):
                storage[key] = storage.get(key, 0.0) + float(value)
    return Snapshot(time.perf_counter(), tuple(clock.totals()), consumer.wait, consumer.step,
                    consumer.start_wait, consumer.batches, consumer.samples, storage, skipped,
                    narrowed, time.process_time())


class StatsWindow:
    """A mark in a loader's counters from which :meth:`Loader.stats` measures a window
    (``loader.stats(window=w)``): each reader of the figures (a report, a Keras callback, a
    TensorBoard helper, the user) keeps its own, so one does not shorten another's."""

    __slots__ = ("mark", "owner")

    def __init__(self, mark: Snapshot | None, owner: object) -> None:
        self.mark = mark  # None: from the first pass's start
        self.owner = weakref.ref(owner)  # the loader whose counters the mark is of


@dataclass(frozen=True)
class LoaderStats:
    """A Loader's counters (:meth:`Loader.stats`): the epoch it stands in, bad samples
    replaced (this epoch and in all), batches handed out in all; where the time went over the
    whole run (``run``) and since the previous call (``window``); and the verdict of the
    window (of the run where the window handed out no batch)."""

    epoch: int
    skipped: int
    skipped_total: int
    batches_total: int
    run: StageFigures | None = None
    window: StageFigures | None = None

    @property
    def verdict(self) -> str:
        figures = self.window if self.window is not None and self.window.batches else self.run
        return figures.verdict() if figures is not None else "no figures"

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "skipped": self.skipped,
                "skipped_total": self.skipped_total, "batches_total": self.batches_total,
                "run": None if self.run is None else self.run.to_dict(),
                "window": None if self.window is None else self.window.to_dict(),
                "verdict": self.verdict}

    def __str__(self) -> str:
        window = self.window if self.window is not None and self.window.batches else self.run
        if window is None:
            return f"epoch {self.epoch}, {self.batches_total} batches"
        span = "last" if window is self.window else "run"
        head = (f"{window.batches:,} batches in {window.seconds:.1f} s ({span}): "
                f"{window.samples_per_s:,.0f} samples/s, step waits {window.wait_share:.1%}")
        if not window.processes:
            shares = window.shares()
            stages = ", ".join(f"{name} {shares[name]:.0%}" for name in STAGES
                               if shares.get(name))
            head += f", threads busy {window.busy_share:.0%}" + (
                f" ({stages})" if stages else "")
        if window.requests:
            head += (f", storage calls {window.storage:.2f} s for "
                     f"{window.requests:,} requests")
        return f"{head}; {self.verdict}"


def scalars(f: StageFigures, *, prefix: str = "") -> dict[str, float]:
    """The figures a dashboard plots (TensorBoard, Keras's logs): ``wait_share``,
    ``samples_per_s``, ``threads_busy`` and ``<stage>_share`` a stage, storage included."""
    out = {f"{prefix}wait_share": f.wait_share, f"{prefix}samples_per_s": f.samples_per_s}
    if not f.processes:  # worker processes: the slices' figures are not measured here
        out[f"{prefix}threads_busy"] = f.busy_share
        for name, share in f.shares().items():
            out[f"{prefix}{name}_share"] = share
    return out


def combine(spans: list[StageFigures]) -> StageFigures:
    """Consecutive spans as one (their seconds and counters added)."""
    first = spans[0]
    return StageFigures(
        seconds=sum(f.seconds for f in spans), batches=sum(f.batches for f in spans),
        samples=sum(f.samples for f in spans), wait=sum(f.wait for f in spans),
        step=sum(f.step for f in spans),
        stages={name: sum(f.stages.get(name, 0.0) for f in spans) for name in STAGES},
        storage=sum(f.storage for f in spans), busy=sum(f.busy for f in spans),
        threads=first.threads, slices=sum(f.slices for f in spans),
        requests=sum(f.requests for f in spans),
        bytes_fetched=sum(f.bytes_fetched for f in spans),
        retries=sum(f.retries for f in spans), skipped=sum(f.skipped for f in spans),
        cache_hits=sum(f.cache_hits for f in spans), cores=first.cores,
        start_wait=sum(f.start_wait for f in spans), prefetch=first.prefetch,
        narrowed=sum(f.narrowed for f in spans), processes=first.processes,
        batch_stages=sum(f.batch_stages for f in spans),
        device_decode=first.device_decode, cpu_seconds=sum(f.cpu_seconds for f in spans))
