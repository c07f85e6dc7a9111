"""The fuzz worker process: runs inputs ``[start, stop)`` under an address-space limit.

Usage (by :mod:`fuzz_run`): ``python fuzz_worker.py CORPUS WORK SEED START STOP MEMORY_BYTES
TIMEOUT_SECONDS``. Prints ``ready``, then one line per input: ``N<TAB>ok`` or
``N<TAB>fail<TAB>{json}``. ``RLIMIT_AS`` makes an allocation past the limit a MemoryError
(a finding) instead of a swapping machine; an input running past the timeout is stopped by
an alarm where it is, so the finding shows where it was stuck.
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

import fuzz_targets


class InputTimeout(BaseException):
    """Raised by the alarm inside an input that ran too long (a BaseException, so that no
    ``except Exception`` of the library takes it for an error of its own)."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise InputTimeout("the input ran past its time limit")


def finding(number: int, what: str, exc: BaseException) -> dict[str, Any]:
    """What a finding reports: the input, the exception and the innermost frames."""
    frames = traceback.extract_tb(exc.__traceback__)
    return {
        "number": number,
        "input": what,
        "error": type(exc).__name__,
        "message": str(exc)[:400],
        "where": [f"{f.filename.rsplit('/src/', 1)[-1]}:{f.lineno} {f.name}"
                  for f in frames[-4:]],
    }


def main(argv: list[str]) -> int:
    corpus, work, seed, start, stop, memory, timeout = argv
    limit = int(memory)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    ws = fuzz_targets.Workspace(Path(corpus), Path(work))
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for number in range(int(start), int(stop)):
        inp = fuzz_targets.make_input(int(seed), number, ws)
        signal.setitimer(signal.ITIMER_REAL, float(timeout))
        try:
            fuzz_targets.run_input(inp, ws)
        except (Exception, InputTimeout) as exc:  # noqa: BLE001 - every escape is a finding
            signal.setitimer(signal.ITIMER_REAL, 0)
            ws.restore(inp.target.folder)  # the alarm may have cut the restore short
            out.write(f"{number}\tfail\t{json.dumps(finding(number, inp.describe(), exc))}\n")
        else:
            signal.setitimer(signal.ITIMER_REAL, 0)
            out.write(f"{number}\tok\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
