"""A Loader turns OpenCV's own thread pool off for the process, threads and worker processes
alike: its threads are the parallelism, and OpenCV's pool workers spin (``sched_yield``)
between the resizes they are handed, burning a core each beside the loader's threads
(``bench/bench_opencv_pool.py``: 717 against 444 CPU µs an image at one loader thread).

Each case is a user's script in a fresh interpreter (OpenCV's pool lives for the process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

SCRIPT = """\
import json, os, threading
import cv2, numpy as np
import shardfeed

def native_threads():
    return len(os.listdir("/proc/self/task")) - threading.active_count()

def probe(sample):
    sample["opencv_threads"] = np.int64(cv2.getNumThreads())
    return sample

if __name__ == "__main__":
    before = cv2.getNumThreads()
    extra_before = native_threads()
    ds = shardfeed.Dataset({folder!r})
    with shardfeed.Loader(ds, batch_size=8, seed=0, num_threads=2,
                          transform=shardfeed.presets.train(size=32)) as loader:
        images = sum(len(b["image"]) for b in loader)
    big = np.zeros((2048, 2048, 3), np.uint8)
    for _ in range(3):  # the pool, were it on, would start and stay
        cv2.resize(big, (1500, 1500), interpolation=cv2.INTER_LINEAR)
    extra_after = native_threads()
    with shardfeed.Loader(ds, batch_size=8, seed=0, num_threads=2, workers="processes",
                          transform=probe) as procs:
        in_workers = sorted({{int(v) for b in procs for v in b["opencv_threads"]}})
    print(json.dumps({{"before": before, "after": cv2.getNumThreads(), "images": images,
                      "extra_before": extra_before, "extra_after": extra_after,
                      "in_workers": in_workers}}))
"""


def test_a_loader_runs_opencv_on_its_own_threads(tmp_path: Path, clean_folder: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(folder=str(clean_folder)))
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["images"] == 103  # the whole epoch, its short last batch kept
    assert seen["after"] == 1, "OpenCV's pool is still on after a Loader ran"
    # no OpenCV worker threads started by the large resizes after the loader
    assert seen["extra_after"] <= seen["extra_before"], seen
    assert seen["in_workers"] == [1], "a worker process runs OpenCV's pool"
