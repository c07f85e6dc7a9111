"""A process waiting for records another process reserved in a shared cache waits at most
its read's deadline (``deadline_seconds``), then fetches them itself; a holder that died is
known dead at once, whatever pid its rows carry (pid 1, as in most containers, or the
reader's own). Walked as users run it: real processes over S3-compatible storage (moto on
127.0.0.1), a holder stopped with SIGSTOP mid-fetch, or killed, or running as pid 1 in a
PID namespace of its own. Every wait is bounded here by a subprocess timeout, never by
pytest's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shardfeed import Dataset, Loader

OPTIONS = "batch_size=8, shuffle=True, seed=3, num_threads=2"

HOLDER = f"""
import sys
from shardfeed import Dataset, Loader
with Dataset(sys.argv[1], cache_dir=sys.argv[2]) as ds, \\
        Loader(ds, {OPTIONS}, read_ahead=2) as loader:
    batches = iter(loader)
    next(batches)
    print("first batch", flush=True)
    sys.stdin.readline()  # the test holds the store's answers from here on
    for batch in batches:
        pass
"""

READER = f"""
import json, os, sqlite3, sys, time
from shardfeed import Dataset, Loader
url, cache, out, deadline, forge = sys.argv[1:6]
if forge == "own-pid":  # the holder had this very pid, in a container of its own
    db = sqlite3.connect(os.path.join(cache, "index.sqlite3"))
    db.execute("UPDATE entries SET pid=? WHERE ready=0", (os.getpid(),))
    db.commit()
    db.close()
started = time.monotonic()
with Dataset(url, cache_dir=cache, source_options={{"deadline_seconds": float(deadline)}}) as ds, \\
        Loader(ds, {OPTIONS}) as loader:
    names = [bytes(n).decode() for b in loader for n in b["name"]]
json.dump({{"names": names, "seconds": time.monotonic() - started}}, open(out, "w"))
"""


def expected_names(folder: Path) -> list[str]:
    with Dataset(str(folder)) as ds, Loader(ds, batch_size=8, shuffle=True, seed=3,
                                            num_threads=2) as loader:
        return [bytes(n).decode() for b in loader for n in b["name"]]


def read(url: str, cache: Path, out: Path, *, deadline: float, timeout: float,
         forge: str = "none", prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the reader in a fresh process; its names and the seconds its epoch took. A reader
    still waiting after ``timeout`` seconds fails the test (it waited past its deadline)."""
    cmd = [*prefix, sys.executable, "-c", READER, url, str(cache), str(out), str(deadline),
           forge]
    try:
        subprocess.run(cmd, env=os.environ.copy(), check=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        late = True
    else:
        late = False
    if late:
        pytest.fail(f"the reader was still waiting after {timeout:.0f} s, with a deadline of "
                    f"{deadline} s: it waited for a holder that will never fill its records",
                    pytrace=False)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def reserved(cache: Path) -> int:
    try:
        db = sqlite3.connect(f"file:{cache / 'index.sqlite3'}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return 0
    try:
        return int(db.execute("SELECT COUNT(*) FROM entries WHERE ready=0").fetchone()[0])
    except sqlite3.Error:
        return 0
    finally:
        db.close()


@contextmanager
def holder_mid_fetch(server: Any, url: str, cache: Path, stop: Callable[[int], None],
                     prefix: tuple[str, ...] = ()) -> Iterator[subprocess.Popen[bytes]]:
    """A process reading the dataset through ``cache``, ``stop``-ped (given its pid) once it
    has reserved its first records and is fetching them (the store holds its GETs, and
    answers them after). Killed when the block ends."""
    proc = subprocess.Popen([*prefix, sys.executable, "-c", HOLDER, url, str(cache)],
                            env=os.environ.copy(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == b"first batch\n"
        with server.stall_gets(".tfrecord", timeout_seconds=120) as stall:
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
            end = time.monotonic() + 90
            while not (reserved(cache) and stall.held):
                assert proc.poll() is None, "the holder ended before reserving anything"
                assert time.monotonic() < end, "the holder never reserved its records"
                time.sleep(0.05)
            stop(proc.pid)
            # the stop lands before the held GETs are answered: a signal returns before every
            # thread of its target has stopped (or died), and on a busy machine a holder
            # still running could fill entries with the answers the stall lets go
            settled({proc.pid, *_children(proc.pid)})
        yield proc
    finally:
        for pid in {proc.pid, *_children(proc.pid)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(30)


def settled(pids: set[int], *, seconds: float = 30.0) -> None:
    """Wait until every thread of ``pids`` is stopped, or gone (the state field of
    ``/proc/PID/task/TID/stat``: T, t, Z, X, or no such task)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        states = []
        for pid in pids:
            for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
                try:
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
                except (OSError, IndexError):
                    continue
        if all(state in "TtZX" for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"the holder's threads did not stop within {seconds} s")


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (unshare's child: the pid 1 of its namespace)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def baseline(url: str, tmp_path: Path) -> float:
    """Seconds an epoch takes a fresh reader on an empty cache (imports included)."""
    run = read(url, tmp_path / "alone", tmp_path / "alone.json", deadline=30, timeout=120)
    return float(run["seconds"])


def test_a_stopped_holder_holds_readers_up_for_their_deadline_only(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    want = expected_names(folder)
    alone = baseline(url, tmp_path)
    cache = tmp_path / "shared"
    deadline = 2.0
    # SIGSTOP: a job suspended (Ctrl-Z), a debugger, a frozen cgroup
    with holder_mid_fetch(s3_server, url, cache, lambda pid: os.kill(pid, signal.SIGSTOP)):
        held = reserved(cache)
        run = read(url, cache, tmp_path / "stopped.json", deadline=deadline,
                   timeout=alone + 40)
        assert run["names"] == want  # fetched by the reader itself, every record its own
        assert run["seconds"] < alone + deadline + 10, (run["seconds"], alone)
        assert held > 0 and reserved(cache) == held  # the holder may wake and fill them
        again = read(url, cache, tmp_path / "again.json", deadline=deadline,
                     timeout=alone + 40)
        # the next reader does not wait for it again: it let a deadline pass
        assert again["names"] == want and again["seconds"] < alone + 10


@pytest.mark.parametrize("forge", ["pid-1", "own-pid"])
def test_a_killed_holder_is_known_dead_whatever_pid_its_rows_carry(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path, forge: str
) -> None:
    """pid 1: the holder ran as pid 1 in its container, as the reader does in its own (liveness
    by pid saw pid 1, itself, alive); own-pid: the holder's pid in its container is the
    reader's in another. The reader's deadline is long: it must not be waited out."""
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    want = expected_names(folder)
    alone = baseline(url, tmp_path)
    cache = tmp_path / "shared"
    with holder_mid_fetch(s3_server, url, cache, kill):
        pass
    if forge == "pid-1":
        db = sqlite3.connect(cache / "index.sqlite3")
        db.execute("UPDATE entries SET pid=1 WHERE ready=0")
        db.commit()
        db.close()
    run = read(url, cache, tmp_path / "read.json", deadline=60, timeout=alone + 30,
               forge=forge)
    assert run["names"] == want
    assert run["seconds"] < alone + 10, (run["seconds"], alone)
    assert reserved(cache) == 0


def _pid_namespaces() -> tuple[str, ...] | None:
    """The command prefix that runs a process as pid 1 of a PID namespace of its own (None
    where this machine does not allow it)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for prefix in ((unshare, "--pid", "--fork"),
                   (unshare, "--user", "--map-current-user", "--pid", "--fork")):
        try:
            done = subprocess.run([*prefix, sys.executable, "-c", "import os; print(os.getpid())"],
                                  check=False, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == "1":
            return prefix
    return None


def test_holder_and_reader_both_pid_1_in_containers_of_their_own(
    s3_server: Any, records_dataset: Callable[[int, int], Path], tmp_path: Path
) -> None:
    prefix = _pid_namespaces()
    if prefix is None:
        pytest.skip("this machine runs no process in a PID namespace of its own (unshare)")
    folder = records_dataset(256, 4)
    url = s3_server.upload_folder(folder)
    want = expected_names(folder)
    alone = baseline(url, tmp_path)
    cache = tmp_path / "shared"
    def kill_pid_1(pid: int) -> None:  # the holder itself, pid 1 where it runs
        for child in _children(pid):
            os.kill(child, signal.SIGKILL)
        os.waitpid(pid, 0)

    with holder_mid_fetch(s3_server, url, cache, kill_pid_1, prefix):
        pass
    run = read(url, cache, tmp_path / "read.json", deadline=60, timeout=alone + 30,
               prefix=prefix)
    assert run["names"] == want
    assert run["seconds"] < alone + 10, (run["seconds"], alone)
