"""The loader's CPU pool: one queue, one limit read where a call could start, calls started in
order, a run of calls at a limit of one on one thread; at 2, 16 and 64 threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from shardfeed.pipeline.executor import CpuPool

WAIT = 30.0  # a bound for waits that end at once unless the pool is wrong


class Watch:
    """What the calls saw: the most running at once, the order they started, their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.started: list[int] = []
        self.threads: list[str] = []

    def call(self, number: int, hold: threading.Event | None = None) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.started.append(number)
            self.threads.append(threading.current_thread().name)
        if hold is not None:
            assert hold.wait(WAIT)
        with self.lock:
            self.now -= 1
        return number


@pytest.mark.parametrize("threads", [2, 16, 64])
def test_every_thread_runs_at_once_when_the_limit_allows(threads: int) -> None:
    pool = CpuPool(threads)
    barrier = threading.Barrier(threads, timeout=WAIT)  # breaks unless all run at once
    try:
        futures = [pool.submit(barrier.wait) for _ in range(threads)]
        assert sorted(f.result(WAIT) for f in futures) == list(range(threads))
        assert len(pool._threads) == threads
    finally:
        pool.shutdown()


@pytest.mark.parametrize("threads", [2, 16, 64])
def test_a_limit_of_one_runs_every_call_on_one_thread_in_order(threads: int) -> None:
    import sys

    # threads switch as often as they can: a finished call and the next one taken are one
    # step, no other thread starts one between them
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    watch = Watch()
    pool = CpuPool(threads, limit=lambda: 1)
    try:
        for _ in range(3):  # runs with idle gaps between them: the same thread is called
            futures = [pool.submit(watch.call, k) for k in range(40)]
            assert [f.result(WAIT) for f in futures] == list(range(40))
            time.sleep(0.01)
    finally:
        sys.setswitchinterval(before)
        pool.shutdown()
    assert watch.most == 1
    assert watch.started == list(range(40)) * 3
    assert len(set(watch.threads)) == 1, set(watch.threads)
    assert watch.threads[0].startswith("shardfeed-loader_")


@pytest.mark.parametrize("threads", [4, 16, 64])
def test_the_limit_is_kept_and_a_raised_limit_starts_the_waiting_calls(threads: int) -> None:
    limit = [2]
    watch = Watch()
    first, rest = threading.Event(), threading.Event()
    pool = CpuPool(threads, limit=lambda: limit[0])

    def running(count: int) -> bool:
        deadline = time.monotonic() + WAIT
        while watch.now < count and time.monotonic() < deadline:
            time.sleep(0.001)
        return watch.now == count

    try:
        futures = [pool.submit(watch.call, k, first if k < 2 else rest)
                   for k in range(2 * threads)]
        assert running(2)
        time.sleep(0.05)  # a third call would have started by now
        assert watch.now == 2 and sorted(watch.started) == [0, 1]
        limit[0] = threads  # the gate chose every thread: the finished calls wake the rest
        first.set()
        assert running(threads)  # every thread runs a call at once
        rest.set()
        assert [f.result(WAIT) for f in futures] == list(range(2 * threads))
    finally:
        first.set()
        rest.set()
        pool.shutdown()
    assert sorted(watch.started[:2]) == [0, 1]  # calls are taken in order (entered: either)
    assert sorted(watch.started) == list(range(2 * threads))
    assert watch.most == threads


@pytest.mark.parametrize("threads", [3, 16])
def test_the_thread_that_went_idle_last_is_called_first(threads: int) -> None:
    """Three threads go idle one after another; at a limit of one, the next run of calls goes
    to the last of them (its caches are warm), not to the one idle longest."""
    limit = [3]
    watch = Watch()
    holds = [threading.Event() for _ in range(3)]
    pool = CpuPool(threads, limit=lambda: limit[0])
    try:
        first = [pool.submit(watch.call, k, holds[k]) for k in range(3)]
        deadline = time.monotonic() + WAIT
        while watch.now < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        names = dict(zip(watch.started, watch.threads))
        for k in (2, 0, 1):  # the thread of call 1 goes idle last
            holds[k].set()
            first[k].result(WAIT)
            while pool.running > 2 - [2, 0, 1].index(k) and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.01)
        limit[0] = 1
        watch.threads.clear()
        assert [f.result(WAIT) for f in [pool.submit(watch.call, 10 + k)
                                         for k in range(20)]] == list(range(10, 30))
    finally:
        for hold in holds:
            hold.set()
        pool.shutdown()
    assert set(watch.threads) == {names[1]}


def test_a_thread_that_cannot_start_leaves_the_calls_to_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    starts = [0]
    start = threading.Thread.start

    def refuse_the_second(self: threading.Thread) -> None:
        starts[0] += 1
        if starts[0] == 2:
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse_the_second)
    watch = Watch()
    pool = CpuPool(4)
    futures = [pool.submit(watch.call, k) for k in range(8)]
    assert sorted(f.result(WAIT) for f in futures) == list(range(8))
    pool.shutdown(wait=True)  # joins only the threads that started
    assert starts[0] >= 2 and all(t.ident is not None for t in pool._threads)


def test_ctrl_c_while_a_thread_starts_keeps_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C lands in ``Thread.start`` after the thread began: the submit raises it, and the
    thread that did start serves the calls after it, one at a time at a limit of one."""
    start = threading.Thread.start
    starts = [0]

    def interrupted_once(self: threading.Thread) -> None:
        start(self)
        starts[0] += 1
        if starts[0] == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted_once)
    watch = Watch()
    pool = CpuPool(4, limit=lambda: 1)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.submit(watch.call, -1)
        futures = [pool.submit(watch.call, k) for k in range(20)]
        assert [f.result(WAIT) for f in futures] == list(range(20))
        assert watch.most == 1 and -1 not in watch.started
        assert pool._called == 0 and pool.running == 0
    finally:
        pool.shutdown()


def test_a_loader_never_closed_exits_cleanly_while_a_slice_runs(clean_folder: Path,
                                                                tmp_path: Path) -> None:
    """A script that ends without closing its Loader while a slice runs inside OpenCV (a user
    transform): the exit waits for the slice (a daemon thread stopped inside a native call
    aborts the process: exit code 134)."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import threading
        import cv2
        import shardfeed
        import shardfeed.transforms as T

        started = threading.Event()

        def blur(sample, rng):
            started.set()
            for _ in range(40):
                sample["image"] = cv2.GaussianBlur(sample["image"], (31, 31), 8)
            return sample

        loader = shardfeed.Loader(
            shardfeed.Dataset({str(clean_folder)!r}), batch_size=8, seed=0, num_threads=2,
            transform=T.Compose([shardfeed.transforms.presets.train(size=256), blur]))
        next(iter(loader))
        started.clear()
        assert started.wait(60)  # a slice of the next batch is inside OpenCV now
        print("took a batch", flush=True)
    """))
    for _ in range(3):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.split() == ["took", "a", "batch"]


def test_shutdown_drops_the_queued_calls_and_joins_the_threads() -> None:
    hold = threading.Event()
    watch = Watch()
    pool = CpuPool(2, limit=lambda: 1)
    running = pool.submit(watch.call, 0, hold)
    queued = [pool.submit(watch.call, k) for k in range(1, 5)]
    deadline = time.monotonic() + WAIT
    while not watch.started and time.monotonic() < deadline:
        time.sleep(0.001)
    threading.Timer(0.05, hold.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert running.result(0) == 0
    assert all(f.cancelled() for f in queued)
    assert watch.started == [0]
    assert not any(t.is_alive() for t in pool._threads)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(watch.call, 9)


def test_a_call_that_raises_hands_its_error_to_its_future() -> None:
    pool = CpuPool(2)
    try:
        def fail() -> None:
            raise ValueError("slice 3 of batch 7")

        with pytest.raises(ValueError, match="slice 3 of batch 7"):
            pool.submit(fail).result(WAIT)
        assert pool.submit(lambda: 5).result(WAIT) == 5  # the thread goes on
    finally:
        pool.shutdown()
