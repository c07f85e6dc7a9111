"""Run the fuzz target: many mutated inputs through one worker process, bounded in time and
memory; report every input that let anything but a ShardfeedError escape.

The suite runs a short pass (``tests/fuzz/test_fuzz.py``; ``pytest --fuzz-inputs N`` for a
longer one). For a long run on one core::

    PYTHONPATH=src python tests/fuzz/fuzz_run.py --inputs 200000 [--seed 0] [--memory-mb 1536]
    PYTHONPATH=src python tests/fuzz/fuzz_run.py --replay 1234 [--seed 0]   # one input, traceback

The worker runs inputs in order; an input that exceeds its time limit is stopped by an alarm
(a finding that shows where it was), one that kills the worker (a crash, or a hang in C code
past twice the limit) is a finding too, and the run goes on with a new worker from the next
input. Findings are printed as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "fuzz_worker.py"
DEFAULT_INPUTS = 2500
"""Inputs of the suite's short run (about 10 s on one core)."""
START_SECONDS = 120.0
"""Time a new worker may take to import and copy the corpus (a loaded machine is slow)."""


@dataclass
class Report:
    """What a run tried and found."""

    inputs: int = 0
    findings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 0
    began: float = field(default_factory=time.monotonic)

    def summary(self) -> str:
        rate = self.inputs / self.seconds if self.seconds else 0.0
        kinds: dict[str, int] = {}
        for f in self.findings:
            kinds[f["error"]] = kinds.get(f["error"], 0) + 1
        found = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing"
        return (f"{self.inputs} inputs in {self.seconds:.1f} s ({rate:.0f}/s, "
                f"{self.workers} worker(s)): found {found}")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"  # one core: the worker is one thread
    import shardfeed  # the worker imports the same shardfeed as this process

    src = str(Path(shardfeed.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def run(
    inputs: int, *, seed: int = 0, start: int = 0, memory_mb: int = 1536,
    timeout_s: float = 5.0, work: Path | None = None,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """Run inputs ``[start, start + inputs)`` of ``seed``; returns the :class:`Report`."""
    import fuzz_corpus

    with tempfile.TemporaryDirectory(prefix="shardfeed-fuzz-") as scratch:
        base = work or Path(scratch)
        corpus = fuzz_corpus.build(base / "corpus")
        report = Report()
        stop = start + inputs
        number = start
        while number < stop:
            number = _one_worker(corpus, base / "work", seed, number, stop, memory_mb,
                                 timeout_s, report, progress)
        report.inputs = stop - start
        report.seconds = time.monotonic() - report.began
        return report


def _one_worker(corpus: Path, work: Path, seed: int, number: int, stop: int,
                memory_mb: int, timeout_s: float, report: Report,
                progress: Callable[[Report], None] | None) -> int:
    """Run a worker from input ``number`` until it finishes or fails; the next input to run."""
    report.workers += 1
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(corpus), str(work), str(seed), str(number),
             str(stop), str(memory_mb << 20), str(timeout_s)],
            stdout=subprocess.PIPE, stderr=errors, env=_env(), bufsize=0,
        )
        assert proc.stdout is not None
        lines = _Lines(proc.stdout.fileno())
        wait = START_SECONDS
        try:
            while number < stop:
                line = lines.next(wait)
                if line is None:
                    proc.kill()
                    report.findings.append({
                        "number": number, "error": "hang", "input": f"input {number}",
                        "message": f"no answer in {wait:.0f} s (the alarm did not stop it)",
                    })
                    return number + 1
                if not line:
                    rc = proc.wait()
                    errors.seek(0)
                    tail = errors.read()[-800:].decode("utf-8", "replace")
                    report.findings.append({
                        "number": number, "error": "worker died", "input": f"input {number}",
                        "message": f"exit status {rc}: {tail}",
                    })
                    return number + 1
                wait = 2 * timeout_s + 10
                if line == "ready":
                    continue
                parts = line.split("\t", 2)
                number = int(parts[0]) + 1
                if parts[1] == "fail":
                    report.findings.append(json.loads(parts[2]))
                if progress is not None and number % 10_000 == 0:
                    report.inputs = number
                    report.seconds = time.monotonic() - report.began
                    progress(report)
            return number
        finally:
            lines.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


class _Lines:
    """Lines from a pipe, each waited for with a timeout (no buffering hides a line that
    has arrived, so a wait that times out means the worker is stuck)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.selector = selectors.DefaultSelector()
        self.selector.register(fd, selectors.EVENT_READ)

    def next(self, timeout: float) -> str | None:
        """The next line without its newline; "" at the end of the stream; None if none
        came within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self.selector.select(left):
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8")

    def close(self) -> None:
        self.selector.close()


def replay(number: int, *, seed: int) -> None:
    """Run one input in this process and let its exception show with the whole traceback."""
    import fuzz_corpus
    import fuzz_targets

    with tempfile.TemporaryDirectory(prefix="shardfeed-fuzz-") as scratch:
        corpus = fuzz_corpus.build(Path(scratch) / "corpus")
        ws = fuzz_targets.Workspace(corpus, Path(scratch) / "work")
        inp = fuzz_targets.make_input(seed, number, ws)
        print(inp.describe())
        fuzz_targets.run_input(inp, ws)
        print("no finding")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--memory-mb", type=int, default=1536)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per input")
    parser.add_argument("--replay", type=int, default=None, metavar="N")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if args.replay is not None:
        replay(args.replay, seed=args.seed)
        return 0
    report = run(args.inputs, seed=args.seed, start=args.start, memory_mb=args.memory_mb,
                 timeout_s=args.timeout,
                 progress=lambda r: print(r.summary(), file=sys.stderr, flush=True))
    for f in report.findings:
        print(json.dumps(f))
    print(report.summary())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
