"""A Loader's stats reported while it runs: a one-line display and a JSON-lines log.

:meth:`Loader.report` attaches a :class:`StatsReport`; after each batch handed out the
consumer's thread calls :meth:`StatsReport.tick`, which advances the display's batch count and,
every ``every`` seconds, takes :meth:`Loader.stats` (its window: the time since the previous
report) and writes it: the display's line (tqdm's ``auto`` bar, a widget in a notebook) and,
with ``jsonl``, one JSON object a line appended to that file (one ``write`` a line, so a
reader never sees half a line of a finished write). No thread of its own.

Determinism: none of this changes a batch. State: when the next report is due. Memory: none.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardfeed.pipeline.stage_clocks import STAGES
from shardfeed.pipeline.stage_stats import LoaderStats


class StatsReport:
    """Reports ``stats()`` every ``every`` seconds (see the module doc)."""

    def __init__(self, stats: Callable[[], LoaderStats], *, every: float, display: bool,
                 jsonl: str | os.PathLike[str] | None) -> None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise ValueError(f"every must be a number of seconds > 0, got {every!r}")
        self.stats = stats
        self.every = float(every)
        self.path = None if jsonl is None else Path(jsonl)
        if self.path is not None:
            # a folder, or a file it cannot write, is said now, not at the first report
            if self.path.is_dir():
                raise ValueError(f"jsonl={str(jsonl)!r} is a folder: give the log file's "
                                 "path (e.g. logs/input.jsonl)")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        self._bar: Any = None
        if display:
            from tqdm.auto import tqdm

            self._bar = tqdm(unit=" batch", dynamic_ncols=True, leave=True,
                             desc="shardfeed", mininterval=1.0)
        self._due = time.perf_counter() + self.every
        self._ticks = 0  # batches since the last report
        self.last: LoaderStats | None = None

    def tick(self) -> None:
        """One batch handed out: the display's count, and a report when one is due. A report
        that fails (a full disk, a log folder removed) is said once in the log and stops
        this report; it never reaches the training loop."""
        try:
            bar = self._bar
            if bar is not None:
                bar.update(1)
            self._ticks += 1
            now = time.perf_counter()
            if now >= self._due:
                self._due = now + self.every
                self.report()
        except Exception as exc:  # noqa: BLE001 - reporting must not stop training
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        logging.getLogger(__name__).warning("stopped reporting the loader's stats: %s", exc,
                                            exc_info=exc)
        self.path = None
        self._due = float("inf")
        bar, self._bar = self._bar, None
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.close()

    def report(self) -> LoaderStats:
        """Take the stats now and write them (display, log)."""
        self._ticks = 0
        stats = self.last = self.stats()
        bar, path = self._bar, self.path  # (another thread may stop the report meanwhile)
        if bar is not None:
            bar.set_postfix_str(line(stats), refresh=True)
        if path is not None:
            record = {"time": time.time(), **stats.to_dict()}
            record.pop("run", None)  # the window is the report; the run is the sum of them
            data = (json.dumps(record) + "\n").encode()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return stats

    def close(self) -> None:
        """Stop: the batches since the last report are reported (so the log's windows add up
        to the run), then nothing more is written. Never raises (a failure is logged)."""
        if self._ticks and (self.path is not None or self._bar is not None):
            try:
                self.report()
            except Exception as exc:  # noqa: BLE001 - closing a loader must go on
                self._failed(exc)
        self.path = None  # a tick that still comes (a pass begun before) writes nothing
        self._due = float("inf")
        bar, self._bar = self._bar, None
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.close()


def line(stats: LoaderStats) -> str:
    """The display's text: rate, the consumer's wait, the stages' shares."""
    window = stats.window if stats.window is not None and stats.window.batches else stats.run
    if window is None:
        return ""
    text = f"{window.samples_per_s:,.0f} samples/s | step waits {window.wait_share:.0%}"
    if window.processes:
        return text
    shares = window.shares()
    parts = " ".join(f"{name} {shares[name]:.0%}" for name in STAGES if shares[name] >= 0.01)
    return (text + f" | threads busy {window.busy_share:.0%}"
            + (f" | {parts}" if parts else ""))
