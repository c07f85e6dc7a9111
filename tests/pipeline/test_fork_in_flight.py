"""A process forked while a Loader, a Dataset or a decoded-image cache had work on its threads:
the child never waits for that work (its threads stayed in the parent). A pass begun in the
parent raises a RuntimeError that says so, or hands out a batch that was already done; the
child's next pass, a new Loader over the parent's Dataset, and a cache load that a parent's
thread had begun all run in the child; the parent goes on unharmed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardfeed.format.writer import ShardWriter

SRC = str(Path(__file__).resolve().parents[2] / "src")

SCRIPT = r"""
import json, os, signal, sys, threading, time
import shardfeed
from shardfeed.pipeline.image_cache import ImageCache

root, threads, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ds = shardfeed.Dataset(root)
loader = shardfeed.Loader(ds, batch_size=8, shuffle=True, seed=0, num_threads=threads,
                          prefetch_batches=8)
it = iter(loader)
first = next(it)
out = {}
if case == "shards":  # a parent's thread inside the shards' lock at the fork
    holding, release = threading.Event(), threading.Event()
    def hold():
        with ds._shards._lock:
            holding.set()
            release.wait()
    threading.Thread(target=hold, daemon=True).start()
    holding.wait()
if case == "cache":  # a parent's thread loading an image at the fork
    cache = ImageCache(max_bytes=1 << 20)
    loading, release = threading.Event(), threading.Event()
    def slow():
        loading.set()
        release.wait()
        return "parent's", 1
    threading.Thread(target=cache.get, args=(7, slow), kwargs={"expires": (0, 9), "now": (0, 0)},
                     daemon=True).start()
    loading.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(100)  # a child that hangs (the defect under test) ends anyway
    try:
        if case == "pass":
            try:
                batch = next(it)
                out["next"] = "batch"
            except RuntimeError as exc:
                out["next"] = str(exc)
            loader.close()
            out["closed"] = True
        elif case == "new_pass":
            out["rest"] = sum(len(b["label"]) for b in loader)
        elif case == "shards":
            with shardfeed.Loader(ds, batch_size=8, num_threads=threads) as fresh:
                out["read"] = sum(len(b["label"]) for b in fresh)
        elif case == "cache":
            out["value"] = cache.get(7, lambda: ("child's", 1), expires=(0, 9), now=(0, 1))
        print(json.dumps(out), flush=True)
    finally:
        os._exit(0)
if case in ("shards", "cache"):
    release.set()
_, status = os.waitpid(pid, 0)
rest = sum(len(b["label"]) for b in it)
loader.close()
print(json.dumps({"parent": len(first["label"]) + rest, "status": status}), flush=True)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fork")
    with ShardWriter(root / "a.tfrecord") as writer:
        for i in range(400):
            writer.write_example({"x": np.arange(64, dtype=np.int64) + i, "label": i})
    return root


def _run(folder: Path, threads: int, case: str) -> tuple[dict[str, object], dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(threads), case],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len(lines) == 2, (done.stdout, done.stderr[-3000:])  # the child's, the parent's
    child, parent = lines
    assert parent == {"parent": 400, "status": 0}  # the parent's pass whole, the child ended
    return child, parent


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_a_pass_begun_before_the_fork_ends_in_the_child(folder: Path, threads: int) -> None:
    child, _ = _run(folder, threads, "pass")
    assert child["closed"] is True
    assert child["next"] == "batch" or "forked" in str(child["next"])
    if child["next"] != "batch":
        assert "iter(loader)" in str(child["next"])


@pytest.mark.parametrize("threads", [2, 8])
def test_the_childs_next_pass_reads_the_rest(folder: Path, threads: int) -> None:
    child, _ = _run(folder, threads, "new_pass")
    assert child["rest"] == 400 - 8  # the epoch after the batch the parent had


def test_a_lock_held_by_a_parents_thread_does_not_stop_the_child(folder: Path) -> None:
    child, _ = _run(folder, 2, "shards")
    assert child["read"] == 400


def test_a_load_begun_by_a_parents_thread_is_loaded_again_in_the_child(folder: Path) -> None:
    child, _ = _run(folder, 1, "cache")
    assert child["value"] == "child's"

