"""Threads kept for the next call: a call never waits behind a stuck one below the bound, the
bound is kept (calls wait, or ``try_submit`` says no), idle threads are reused (a thread a call
would take a new malloc arena each time), and every pool of the package is in the inventory
with a finite bound."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shardfeed.storage.daemon_threads import DaemonThreads


def test_calls_one_after_another_reuse_one_thread() -> None:
    pool = DaemonThreads("test-kept", limit=8, why="a test")
    seen = []
    for n in range(20):
        assert pool.submit(lambda n=n: (seen.append(threading.current_thread()), n)[1]).result(5) == n
    assert pool.threads == 1
    assert len(set(seen)) == 1 and seen[0].daemon and seen[0].name == "test-kept"


def test_a_call_never_waits_behind_a_stuck_one() -> None:
    pool = DaemonThreads("test-stuck", limit=8, why="a test")
    release = threading.Event()
    pool.submit(lambda: 1).result(5)  # one idle thread
    stuck = pool.submit(release.wait)  # takes the idle thread
    time.sleep(0.05)
    try:
        assert pool.submit(lambda: "free").result(5) == "free"  # a new thread, not a wait
        assert pool.threads == 2
    finally:
        release.set()
    assert stuck.result(5) is True


def test_several_calls_submitted_at_once_each_get_a_thread() -> None:
    pool = DaemonThreads("test-burst", limit=8, why="a test")
    pool.submit(lambda: None).result(5)
    gate = threading.Barrier(4, timeout=5)
    futures = [pool.submit(gate.wait) for _ in range(4)]  # all four must run at once
    assert sorted(f.result(10) for f in futures) == [0, 1, 2, 3]
    assert pool.threads == 4


def test_a_bound_makes_calls_wait() -> None:
    pool = DaemonThreads("test-bound", limit=2, why="a test")
    release = threading.Event()
    order: list[int] = []
    blockers = [pool.submit(release.wait) for _ in range(2)]
    queued = [pool.submit(lambda n=n: order.append(n)) for n in range(5)]
    time.sleep(0.05)
    assert order == [] and pool.threads == 2
    release.set()
    for f in blockers + queued:
        f.result(5)
    assert sorted(order) == [0, 1, 2, 3, 4]
    assert pool.threads == 2


def test_an_exception_reaches_the_caller_and_the_thread_serves_on() -> None:
    pool = DaemonThreads("test-raise", limit=8, why="a test")

    def fail() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        pool.submit(fail).result(5)
    assert pool.submit(lambda: 7).result(5) == 7
    assert pool.threads == 1


def test_a_call_cancelled_before_it_starts_is_dropped() -> None:
    pool = DaemonThreads("test-cancel", limit=1, why="a test")
    release = threading.Event()
    ran: list[int] = []
    first = pool.submit(release.wait)
    second = pool.submit(lambda: ran.append(1))
    assert second.cancel()
    release.set()
    first.result(5)
    pool.submit(lambda: None).result(5)
    assert ran == []


def _in_child(pool: DaemonThreads, out: Any) -> None:
    out.put(pool.submit(lambda: "child").result(5))


def test_a_forked_child_starts_threads_of_its_own() -> None:
    """A process worker forked from a parent whose pool has an idle thread: the child has no
    such thread, and a call there must run, not wait on it for ever."""
    import multiprocessing

    pool = DaemonThreads("test-fork", limit=8, why="a test")
    pool.submit(lambda: None).result(5)  # the parent now has an idle thread
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(pool, out))
    child.start()
    try:
        assert out.get(timeout=20) == "child"
    finally:
        child.join(20)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0


def test_at_the_bound_try_submit_starts_nothing() -> None:
    pool = DaemonThreads("test-try", limit=1, why="a test")
    release = threading.Event()
    busy = pool.try_submit(release.wait)
    assert busy is not None
    time.sleep(0.05)
    assert pool.busy == 1
    assert pool.try_submit(lambda: "more") is None  # nothing queued, nothing started
    release.set()
    assert busy.result(5) is True
    deadline = time.monotonic() + 5
    while pool.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    again = pool.try_submit(lambda: "now")
    assert again is not None and again.result(5) == "now"
    assert pool.threads == 1


def test_every_pool_of_the_package_is_in_the_inventory_with_a_bound() -> None:
    import importlib
    import pkgutil

    import shardfeed
    from shardfeed.storage.daemon_threads import pools

    for module in pkgutil.walk_packages(shardfeed.__path__, "shardfeed."):
        if (module.name.split(".")[1] in ("torch", "jax", "tf", "keras", "loaders", "cli")
                or module.name.endswith("__main__")):
            continue  # adapters and the command line: no kept pools of their own
        importlib.import_module(module.name)
    found = {pool.name: pool for pool in pools()}
    assert {"shardfeed-patch-decode", "shardfeed-read-ahead", "shardfeed-storage",
            "shardfeed-info", "shardfeed-cache-read", "shardfeed-cache-wait"} <= set(found)
    for pool in found.values():
        assert 1 <= pool.limit <= 1024 and pool.why, pool.name
