"""How many batch slices are built at once (all the threads, unless fewer measure faster),
and how large they are.

Worker threads help when the work releases the GIL (decoding a large JPEG); when most of it
is Python that holds the GIL (small images: reading, parsing and writing a record costs as
much as decoding it), two threads fight over the GIL and build slower than one. The gate
measures instead of guessing::

    warm-up     all threads      nothing (``WARMUP_WINDOWS``: first reads, caches filling)
    trial       all threads, 1, all threads, 1 (``TRIAL_PAIRS`` pairs, one window each,
                                 a settling window before each change's measured one)
                                 samples built / wall seconds (``IDLE_GAP_SECONDS``),
                                 summed a limit (alternating cancels a drift in speed);
                                 one thread is not tried when a sample takes at least
                                 ``HEAVY_SAMPLE_SECONDS`` of thread CPU and the threads ran
                                 side by side (decodes that release the GIL);
                                 one thread is kept without a trial when a sample takes at
                                 most ``LIGHT_SAMPLE_SECONDS`` of wall time (tiny work; the
                                 first choice only)
    then        the faster one (fewer threads only when at least ``MARGIN`` faster), kept
                until the next trial: after at least ``RECHECK_SECONDS`` at the chosen
                limit, twice as long after each trial that confirms the choice (at most
                ``MAX_RECHECK_SECONDS``), and never before the trial's own cost allows
                (below), as the work may change

A window is ``window_samples`` samples and at least ``MIN_WINDOW_SECONDS`` long (a window of
fast samples over in a few milliseconds is mostly noise), and ends at ``MAX_WINDOW_SECONDS``
of wall time whatever its samples; windows that are not measured (warm-up, settling) and a
first window of tiny work end at ``window_samples`` (or that wall time). A window ends when a
slice finishes. The gate chooses the limit; the loader's CPU pool
(:class:`~shardfeed.pipeline.executor.CpuPool`) keeps it, starting slices in the order they
were submitted, so batches still complete in order.

How large a slice is (:meth:`SliceGate.slice_size`): a batch over the threads, larger where a
slice's own Python (submitting it, the gate, its plan, its hand-over) would cost much beside
its work: at least ``MIN_SLICE_SECONDS`` of work, and, where the threads share one GIL, at
least ``SLICE_SECONDS_A_THREAD`` for each other thread building at once, which each waits
for; never so large that a thread that may build has no slice among the batches in flight,
nor past ``SLICE_RECORD_BYTES`` of records (:func:`largest_slice`, which the memory budget
counts too). Past a batch, a slice is whole batches (up to ``BATCHES_A_SLICE``), built one
after another by one task: small, light batches pay a slice's own costs once for several.
Only at a choice, between trials: a window ends as a slice finishes, and many slices of
several batches finishing at once would make a trial's windows read bursts.

What measuring costs, at any core count. The gate counts the wall time of every window at
the limit it ran (:meth:`SliceGate.stats`); time at a limit other than the one chosen (a
trial's windows at the other limit, with their settling windows) is what measuring costs.
A trial that cost ``c`` seconds is followed by at least ``2c / BUDGET`` seconds at the
chosen limit before the next one starts. With ``c_k`` the cost of trial ``k``, ``C`` the
largest, and trial ``K`` the one in progress or last finished, a run of ``T`` seconds holds
the waits after trials ``1 .. K-1``, so::

    off-choice time  =  c_1 + ... + c_K  <=  BUDGET/2 × T + C  <=  BUDGET × T
                                              once T >= 2C / BUDGET

and ``C`` is at most ``2 × TRIAL_PAIRS`` windows at the other limit, each at most
``MAX_WINDOW_SECONDS`` plus one slice. This holds whatever the work and the number of cores,
because a window is bounded in wall time, not in samples. The worst case is work that scales
perfectly with threads on 64 cores: a one-thread window builds 1/64 of what an all-thread
window does, so nearly all of its time is lost. Counted in samples, such a window would last
64 all-thread windows (on a 16-core node such a schedule ran the train preset at 1,079
images/s against 5,620 with every thread held); bounded in time, it loses at most its
time, and the rate over the run is at least ``1 - BUDGET`` of the all-thread rate
(``1 - BUDGET/2`` in the long run). Work where one thread is faster (GIL-bound) is the mirror
case: its trials at every thread cost the same share against the one-thread rate. The first trial comes before any time at a chosen
limit: where the threads' CPU time shows them running side by side (``PARALLEL_DEFER``), the
gate keeps every thread and waits for twice the trial's estimated cost over ``BUDGET`` first,
as for any trial; otherwise (GIL-bound work, where a one-thread window loses at most half its
time; or threads that wait on reads, which their CPU time does not show) it tries at once,
and that one trial, at most ``C``, is the only time not amortised (small images on 2 cores
still end at one thread within a few windows).

Determinism: none of this changes which rows are built or their bytes (a slice writes fixed
rows whichever thread builds it, whenever). State: none saved; it starts again with each
Loader. Memory: a few counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from shardfeed.pipeline.cores import usable_cores

T = TypeVar("T")

BUDGET = 0.03
"""The most of the wall time spent at a limit other than the chosen one, over any run longer
than ``2 / BUDGET`` times the costliest trial: see the module docstring."""
MARGIN = 1.05
"""Fewer threads are kept only when they build at least this much faster (noise guard)."""
MIN_WINDOW_SECONDS = 0.025
"""The shortest window measured: fast work takes more samples a window."""
MAX_WINDOW_SECONDS = 0.1
"""The longest window: slow work takes fewer samples a window (a window ends when a slice
finishes, so a slice longer than this is a window of its own)."""
RECHECK_SECONDS = 2.0
"""Seconds at the chosen limit before the first new trial (and after a trial that changed the
choice), unless the trial's cost asks for more (``2 × cost / BUDGET``)."""
MAX_RECHECK_SECONDS = 64.0
"""The longest wait between trials that keep confirming the choice (each doubles it): how
long a change in the work may go unnoticed, unless a trial's cost asks for more."""
WARMUP_WINDOWS = 2
"""Windows a new gate runs at every thread before measuring (the first reads of a loader open
files and fill caches, and run several times slower than the rest)."""
IDLE_GAP_SECONDS = 0.02
"""A window's time is wall time: while slices build, and while none does, up to this much a
gap. Gaps count because threads that starve the consumer of the GIL slow it down, and it then
asks for slices later (measuring only building time would favour them); longer gaps are the
consumer pausing (an evaluation, a checkpoint), which no limit causes."""
TRIAL_PAIRS = 2
"""Windows measured a limit in a trial, alternating between the two limits."""
LIGHT_SAMPLE_SECONDS = 5e-6
"""Work of at most this much wall time a sample with every thread (28×28 raw records: 2–3 µs)
and of at most this much thread CPU a sample is held to one slice at a time without a trial
for the gate's first choice: a trial's windows at every thread would cost a large part of a
short epoch, and such work rarely gains from threads; later trials are full trials, which
correct it. The CPU time too: a window that ends as many large slices finish at once (whole
batches of 28² PNGs, 8 µs of decoding a sample) reads less wall time a sample than the work
takes."""
HEAVY_SAMPLE_SECONDS = 50e-6
"""Work of at least this much thread CPU time a sample (a 128×96 JPEG crop: about 70 µs; a
large JPEG: about 1 ms) whose threads ran side by side in the first measured window (their
CPU time at least ``PARALLEL_SHARE`` of the cores they could use, the decode releasing the
GIL) gains from every thread: one thread is not tried (a trial costs time). Heavy work that
holds the GIL keeps its threads' CPU time near one core's, and is tried."""
MIN_SLICE_SECONDS = 1e-3
"""The least thread CPU time a slice of light work is given (see :meth:`SliceGate.slice_size`):
a slice's own Python (submitting it, the gate, planning its read, handing its rows over) holds
the GIL for about 80 µs on a 2-core machine whatever its samples, so 16-sample slices of 28×28
PNGs (15 µs a sample) spend a quarter of their time on it, and past a few threads those costs
queue for the GIL."""
SLICE_SECONDS_A_THREAD = 4e-3
"""The least thread CPU time a slice is given for each other thread that may build at once,
where the threads share one GIL (see :meth:`SliceGate.slice_size`). Each slice's own Python
holds the GIL whatever its samples (the train preset's: ~190 µs a 16-image slice on a
2-core machine whose cores decode twice as fast as the training node's, the decode aside,
against 14 µs an image), and a thread waits for the others': at ``limit`` threads, slices of
``D`` seconds keep each waiting ``(limit - 1) × F / D`` of its time. 4 ms a thread keeps
that near a tenth for ``F`` of 0.4 ms (the node's). At 16 threads, slices of 60 ms: the
train preset's 16-image slices become 43 or so (1.4 ms an image on the node), a slice still
for each thread among 4 batches in flight; 1566² frames (10 ms or more an image) are cut as
before. At 2 threads, 4 ms: a train batch over the threads is more, and so was the demo's
(``make demo``: 0.65-0.67 of its decode limit with 8 ms, 0.70-0.71 with 4 ms and without
the rule); 28² PNGs get a batch a slice."""
SLICE_RECORD_BYTES = 8 << 20
"""The most encoded record bytes a slice is enlarged to hold (see :meth:`SliceGate.slice_size`:
a thread holds its slice's records while it builds): 64 images of 1566² (945 KB each) would
hold 60 MB a thread, about 1 GB at 16 threads; such images take ~10 ms each, so their
slices need no enlarging."""
PARALLEL_SHARE = 0.75
"""See ``HEAVY_SAMPLE_SECONDS``: the share of ``min(threads, cores)`` cores."""
PARALLEL_DEFER = 2.0
"""Threads whose CPU time in the first measured window is at least this many cores' worth
(they ran side by side, but not enough for ``PARALLEL_SHARE``) keep every thread for the
gate's first choice, and their first trial waits, as any later one, for twice its estimated
cost over ``BUDGET``: a one-thread window would build a fraction of theirs. GIL-bound work
keeps its threads' CPU time near one core's and is tried at once (small images end at one
thread within a few windows)."""


def largest_slice(base: int, batch: int, ahead: int, threads: int, sample_bytes: int) -> int:
    """The most samples :meth:`SliceGate.slice_size` puts in a slice of ``batch``-sample
    batches cut for ``threads`` threads from ``base``: as many as leave a slice for each of
    them among the ``ahead`` batches in flight, never fewer than ``base``. Within a batch
    where its records would pass ``SLICE_RECORD_BYTES`` at ``sample_bytes`` a sample (0:
    none held); else up to ``BATCHES_A_SLICE`` whole batches, which the slice builds one
    after another (a thread holds one batch's records at a time): with many small batches
    in flight, a slice's own costs (submitting it, the gate, its hand-over) are paid once
    for several batches."""
    most = max(1, ahead * batch // max(1, threads))
    records_most = SLICE_RECORD_BYTES // sample_bytes if sample_bytes > 0 else most
    if most >= 2 * batch and batch <= records_most:
        return max(base, min(most // batch, BATCHES_A_SLICE) * batch)
    return max(base, min(most, batch, max(1, records_most)))


BATCHES_A_SLICE = 4
"""The most whole batches one slice builds (see :func:`largest_slice`); with them, the
batches built at once go up to this many a thread where they are small
(:func:`~shardfeed.pipeline.pool.batches_in_flight`)."""


@dataclass(frozen=True, slots=True)
class GateStats:
    """What a gate measured so far: ``seconds`` of wall time (building, and idle gaps up to
    ``IDLE_GAP_SECONDS``) at each limit; ``off_choice_seconds`` of them at a limit other than
    the one chosen at the time (before the first choice, every thread counts as chosen);
    ``trials`` started (the first measured windows are the first); ``limit`` now."""

    seconds: Mapping[int, float]
    off_choice_seconds: float
    trials: int
    limit: int

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def off_choice_share(self) -> float:
        """``off_choice_seconds`` over all seconds (0 before any): at most ``BUDGET`` over a
        run longer than ``2 / BUDGET`` times the costliest trial."""
        total = self.total_seconds
        return self.off_choice_seconds / total if total > 0 else 0.0


class SliceGate:
    """Picks :attr:`limit`, the most slices that build at once, by measuring (the loader's
    CPU pool keeps it: see :class:`~shardfeed.pipeline.executor.CpuPool`).

    ``threads``: the most at once (the Loader's ``num_threads``); ``adaptive=False`` keeps
    that limit (process workers, whose slices barely hold the GIL; or a Loader built with
    ``adaptive_threads=False``). ``clock``: seconds; ``min_window_seconds`` and
    ``max_window_seconds``: see ``MIN_WINDOW_SECONDS`` and ``MAX_WINDOW_SECONDS``.
    """

    def __init__(self, threads: int, *, window_samples: int, adaptive: bool = True,
                 shares_gil: bool = True,
                 clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 min_window_seconds: float = MIN_WINDOW_SECONDS,
                 max_window_seconds: float = MAX_WINDOW_SECONDS) -> None:
        self.threads = threads if adaptive else 1  # one "thread" level: nothing to choose
        self.limit = threads
        self.shares_gil = shares_gil  # threads of one process (not worker processes)
        # the encoded bytes of a sample's records a slice holds (None: not known; 0: none,
        # as a patch's, cut from a cached image; see slice_size)
        self.sample_bytes: int | None = None
        self._all = threads  # every thread (or process) at once
        self.window_samples = max(1, window_samples)
        self.min_window_seconds = min_window_seconds
        self.max_window_seconds = max(min_window_seconds, max_window_seconds)
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._cores = min(self.threads, usable_cores())
        self._lock = threading.Lock()
        self.fixed = False
        self._active = 0
        self._busy_since = 0.0
        self._busy = 0.0  # the window's seconds: see IDLE_GAP_SECONDS
        self._idle_since: float | None = None  # when the last slice finished, none running
        self._samples = 0
        self._slices = 0
        self._cpu = 0.0  # the window's thread CPU seconds, building
        self._trial: list[tuple[int, int, float]] = []  # (limit, samples, busy seconds)
        self._warmup = WARMUP_WINDOWS
        self._settle = False  # the next window follows a change of limit: not recorded
        self._chosen = False  # a first choice was made (later ones are always full trials)
        self._choice = threads  # the limit in force between trials (held: every thread)
        self._wait_left: float | None = None  # seconds at the choice before the next trial
        self._interval = RECHECK_SECONDS
        self._seconds: dict[int, float] = {}
        self._off = 0.0  # seconds at a limit other than the choice
        self._trial_off = 0.0  # self._off when the trial in progress started
        self._trials = 0
        self._sample_cpu = 0.0  # thread CPU seconds a sample, last measured (0: not yet)
        # slice_size's last answer and what it was worked out from (read and replaced whole)
        self._last_cut: tuple[tuple[object, ...] | None, int] = (None, 0)
        self._windows = 0

    def slice_size(self, base: int, batch: int, ahead: int) -> int:
        """Samples a slice of ``batch``-sample batches, from ``base`` (a batch over the
        threads), with ``ahead`` batches built at once: within a batch, or (at the choice
        of every thread, between trials) up to ``BATCHES_A_SLICE`` whole batches where
        :func:`largest_slice` allows them.

        Fewer slices at once than threads: larger slices (a slice's fixed costs paid less
        often), within ``SLICE_RECORD_BYTES`` of records where a sample's are known. Light
        work (less thread CPU over ``base`` than ``MIN_SLICE_SECONDS``): slices of at least
        that much. Where the threads share the GIL and a sample's record bytes are known
        (:attr:`sample_bytes`): slices of at least ``SLICE_SECONDS_A_THREAD`` for each other
        thread that may build at once, within ``SLICE_RECORD_BYTES`` of records. Either way
        never so large that fewer slices are in flight than may build at once
        (``ahead × batch / limit``), so every allowed thread still has one
        (:func:`largest_slice`). At any core count: the slices' fixed costs, which every
        thread pays under the GIL, take about a tenth of it at most, or the slices are as
        large as the threads and the memory bound allow. Which samples a slice holds never
        changes the rows built or their bytes.

        Asked once a batch with the same answer until a window's measure or the limit
        changes: the last answer is kept with what it was worked out from."""
        asked = (base, batch, ahead, self.limit, self._all, self.sample_bytes, self.fixed,
                 self.shares_gil, self._sample_cpu, self._at_choice())
        if asked == self._last_cut[0]:
            return self._last_cut[1]
        size = self._slice_size(base, batch, ahead)
        self._last_cut = (asked, size)
        return size

    def _at_choice(self) -> bool:
        """Whether the choice of every thread is in force between trials (not warming up,
        not in a trial, not held): slices of several batches are cut then only. At a choice
        of fewer threads, a trial that starts would let every thread take the queued ones
        at once."""
        return (self._chosen and self._wait_left is not None and not self.fixed
                and self.limit == self._all)

    def _slice_size(self, base: int, batch: int, ahead: int) -> int:
        limit = max(1, self.limit)
        size = base
        if limit < self._all:  # a batch over the threads that build at once
            size = max(base, -(-batch // limit))
            if self.sample_bytes and not self.fixed:
                # within the records' bound: a slice cut now may build beside others once a
                # trial raises the limit (one thread's whole batch of 1 MiB records: 256
                # MiB); cut evenly (a held limit never rises: its slices stay as they are)
                most = SLICE_RECORD_BYTES // self.sample_bytes
                if size > most:
                    size = max(base, -(-batch // -(-batch // max(1, most))))
        per_sample = self._sample_cpu
        if per_sample <= 0:
            return size
        cut = size
        if per_sample * size < MIN_SLICE_SECONDS:  # light work
            # within the records' bound too, where known (large records, little work each)
            cut = max(cut, min(int(-(-MIN_SLICE_SECONDS // per_sample)),
                               largest_slice(size, batch, ahead, limit, self.sample_bytes or 0)))
        least = SLICE_SECONDS_A_THREAD * (limit - 1)  # the others' costs, waited for
        if self.shares_gil and self.sample_bytes is not None and per_sample * cut < least:
            cut = max(cut, min(int(-(-least // per_sample)),
                               largest_slice(size, batch, ahead, limit, self.sample_bytes)))
        if cut == size:
            return size
        if cut >= 2 * batch and self._at_choice():
            # whole batches a slice (largest_slice: they are a bound), only at a choice: a
            # trial's windows end as slices finish, and many slices of several batches
            # finishing at once would make them read bursts
            return cut // batch * batch
        if cut >= batch:
            return batch
        # even slices, none past the cut (a bound): 256 cut at 55 goes in 5 of 52, not 64s
        return -(-batch // -(-batch // cut))

    def run(self, samples: int, build: Callable[[], T], skip: Callable[[], bool]) -> T | None:
        """``build()``, measured; None without building if ``skip()`` says that the slice is
        no longer wanted (its run was closed). The caller keeps :attr:`limit` (the loader's
        CPU pool starts at most that many slices at once, in order)."""
        with self._lock:
            self._active += 1
            if self._active == 1:
                now = self._clock()
                if self._idle_since is not None:  # see IDLE_GAP_SECONDS
                    self._busy += min(now - self._idle_since, IDLE_GAP_SECONDS)
                self._busy_since = now
        cpu = self._cpu_clock()
        try:
            return None if skip() else build()
        finally:
            cpu = self._cpu_clock() - cpu
            with self._lock:
                self._cpu += cpu
                now = self._clock()
                self._busy += now - self._busy_since  # at least one slice building
                self._busy_since = now
                self._active -= 1
                if self._active == 0:
                    self._idle_since = now
                self._samples += samples
                self._slices += 1
                if self._window_over():
                    self._end_window()

    def stats(self) -> GateStats:
        """Seconds at each limit so far, and those at a limit other than the chosen one."""
        with self._lock:
            seconds = dict(self._seconds)
            seconds[self.limit] = seconds.get(self.limit, 0.0) + self._busy  # open window
            off = self._off + (self._busy if self.limit != self._choice else 0.0)
            return GateStats(seconds=seconds, off_choice_seconds=off, trials=self._trials,
                             limit=self.limit)

    def _window_over(self) -> bool:
        """Whether the window ends now: at ``max_window_seconds`` whatever its samples;
        else once it has ``window_samples`` and lasted ``min_window_seconds``; sooner when it
        is not measured (warm-up, settling after a change of limit), or when it is the first
        choice's and its samples already took at most ``LIGHT_SAMPLE_SECONDS`` each (a pause
        would only make them look slower)."""
        if self._busy >= self.max_window_seconds:
            return True
        if self._samples < self.window_samples:
            return False
        if self._busy >= self.min_window_seconds or self._warmup > 0 or self._settle:
            return True
        return (not self._chosen and self.threads > 1 and not self._trial
                and self._busy <= LIGHT_SAMPLE_SECONDS * self._samples
                and self._cpu <= LIGHT_SAMPLE_SECONDS * self._samples)

    def _end_window(self) -> None:
        """A window's time is in: count it at its limit; record its rate in the trial, or
        count down to the next trial.

        Windows of the warm-up, and the window after a change of limit (slices let in under
        the old limit may still be building), are not recorded in a trial.
        """
        samples, busy, cpu, slices = self._samples, self._busy, self._cpu, self._slices
        self._samples, self._busy, self._cpu, self._slices = 0, 0.0, 0.0, 0
        self._windows += 1
        if samples > 0 and self._windows > WARMUP_WINDOWS:  # first reads are slow: not them
            self._sample_cpu = cpu / samples
        self._seconds[self.limit] = self._seconds.get(self.limit, 0.0) + busy
        if self.limit != self._choice:
            self._off += busy
        if self.threads == 1 or self.fixed:
            return
        if self._wait_left is not None:  # at the choice (settling back to it counts too)
            self._settle = False
            self._wait_left -= busy
            if self._wait_left <= 0:
                self._start_trial()
            return
        if self._settle:
            self._settle = False
            return
        if self._warmup > 0:
            self._warmup -= 1
            if self._warmup == 0:
                self._trials += 1  # the first trial starts
            return
        self._trial.append((self.limit, samples, busy))
        if (len(self._trial) == 1 and cpu >= HEAVY_SAMPLE_SECONDS * samples
                and cpu >= PARALLEL_SHARE * self._cores * busy):
            self._choose(self.threads)  # threads help: no trial of one
            return
        if (len(self._trial) == 1 and not self._chosen
                and busy <= LIGHT_SAMPLE_SECONDS * samples
                and cpu <= LIGHT_SAMPLE_SECONDS * samples):
            self._choose(1)  # too little work a sample for threads to pay their hand-overs
            return
        if len(self._trial) == 1 and not self._chosen and cpu >= PARALLEL_DEFER * busy:
            # threads ran side by side: one thread would cost much of the trial's time. Keep
            # them, and try one only once every thread has run what the trial's estimated
            # cost asks for (a slice at one thread is ``threads`` slices of this window)
            one_slice = self.threads * cpu / max(1, slices)
            self._choose(self.threads,
                         cost=2 * TRIAL_PAIRS * (self.max_window_seconds + one_slice))
            return
        if len(self._trial) < 2 * TRIAL_PAIRS:
            self._set_limit(1 if self.limit == self.threads else self.threads)
            return
        full = self._trial_rate(self.threads)
        single = self._trial_rate(1)
        self._choose(1 if single >= MARGIN * full else self.threads)

    def _start_trial(self) -> None:
        self._wait_left = None
        self._trial = []
        self._trial_off = self._off
        self._trials += 1
        self._set_limit(self.threads)
        self._settle = True  # slices cut at the choice may still be building: not measured

    def _choose(self, limit: int, *, cost: float | None = None) -> None:
        """Keep ``limit`` until the next trial: after the wait (doubled while trials confirm
        the choice), and at least twice the trial's off-choice seconds (or ``cost``, the
        next trial's estimated) over ``BUDGET``."""
        confirmed = self._chosen and limit == self._choice
        self._interval = (min(2 * self._interval, MAX_RECHECK_SECONDS) if confirmed
                          else RECHECK_SECONDS)
        if cost is None:
            cost = self._off - self._trial_off
        self._wait_left = max(2 * cost / BUDGET, self._interval)
        self._choice = limit
        self._chosen = True
        self._set_limit(limit)

    def keep_all_threads(self) -> None:
        """Build with every thread from now on, with no trial: slices that may wait for data
        from object storage gain from threads whatever their work (a trial would time the
        waits, not the work)."""
        with self._lock:
            self.fixed = True
            self._choice = self._all
            self._set_limit(self._all)

    def hold(self, limit: int) -> None:
        """Build at most ``limit`` slices at once from now on, with no trial (a batch stage
        whose slices hold the GIL asked for it: see ``SliceBoundStage``)."""
        with self._lock:
            self.fixed = True
            self._choice = max(1, min(limit, self._all))
            self._set_limit(self._choice)

    def _trial_rate(self, limit: int) -> float:
        """Samples a second at ``limit`` over the trial's windows at that limit."""
        samples = sum(n for at, n, _ in self._trial if at == limit)
        busy = sum(t for at, _, t in self._trial if at == limit)
        return samples / busy if busy > 0 else float("inf")

    def _set_limit(self, limit: int) -> None:
        self._settle = limit != self.limit
        self.limit = limit
