"""Hostile cache folders and holders of the fuzz target.

::

    corpus/cache-plans/   folder.plan, holders.plan: bytes read as a plan, each byte picking
                          the next step (so every mutation of a plan is a plan)

``cache-folder``: a cache holding the two records of :mod:`fuzz_cache`, then changed as
another user of the machine could: links planted at the index, its WAL or journal, the key,
the entry folders, an entry, the lock or temp folders (to a file of the user's outside the
cache, a folder, a device, a missing path, the folder itself); a hard link or a FIFO in the
index's place; entries forged (the key's public digest and a CRC32C, a MAC under another key,
the other record's file); the key shortened, replaced, made readable by all or removed; the
folder made writable by all; reservations forged with hostile holders under pid 1 or the
reader's own; junk among the lock and temp files. The cache is then opened (trusted or not),
read, waited on, written, verified, summarised, closed and opened again. Only a
ShardfeedError may escape; a read gives its own record or a miss; a wait ends within its
deadline; nothing outside the cache folder changes.

``cache-holders``: one or two processes (forked) reserve records of a fresh cache, then
stop (SIGSTOP) or die (SIGKILL) before or in the middle of writing, exit holding them, fill
them, or close. A reader waits for the records (a deadline of 5 or 15 ms): the wait must end
within it (plus :data:`MARGIN_SECONDS` for a loaded machine), give each record or a miss,
and not hold up a second wait; once the stopped holders are killed, the next opening must
leave no reservation and no temp file behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import shutil
import signal
import sqlite3
import stat
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import fuzz_cache
import google_crc32c

from shardfeed.errors import ShardfeedError
from shardfeed.storage.disk_cache import DiskCache

FOLDER = "cache-plans"
FILES = {"cache-folder": "folder.plan", "cache-holders": "holders.plan"}
MARGIN_SECONDS = 2.0
"""What a wait may take past its deadline on a loaded machine (a wait on a stopped holder
that ignored the deadline took 60 s)."""
HOLDER_SECONDS = 3.0
"""How long a forked holder may take to reserve and stop (or end) before it counts as hung."""

KEYS, RECORDS, URL = fuzz_cache.KEYS, fuzz_cache.RECORDS, fuzz_cache.URL
SIZE = fuzz_cache.RECORD_BYTES
TOKEN = "0123456789abcdef"  # a holder name no process holds

T = TypeVar("T")


class Plan:
    """The steps of a plan: each :meth:`pick` reads the next byte (0 past the end)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        b = self.data[self.at] if self.at < len(self.data) else 0
        self.at += 1
        return b

    def pick(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]


def build(folder: Path) -> None:
    """The seed plans."""
    folder.mkdir(parents=True)
    (folder / FILES["cache-folder"]).write_bytes(bytes(range(3, 40, 3)))
    (folder / FILES["cache-holders"]).write_bytes(bytes([2, 0, 3, 1, 5, 2, 4, 1, 7, 1]))


def mutate_plan(rng: Any, data: bytes) -> bytes:
    """A plan of random steps, or this one with a few steps changed."""
    if rng.random() < 0.5 or not data:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(4, 40)))
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        out[rng.randrange(len(out))] = rng.randrange(256)
    return bytes(out)


def _quietly(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except ShardfeedError:
        return None


def _check_read(got: Sequence[bytes | None] | None, keys: Sequence[str]) -> None:
    for key, data in zip(keys, got or ()):
        if data is not None and data != RECORDS[KEYS.index(key)]:
            raise AssertionError(f"entry {key} served {len(data)} bytes that are not its record")


def _snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under ``folder`` (links not followed): its mode and a file's bytes."""
    out = {}
    for path in sorted(folder.rglob("*")):
        found = os.lstat(path)
        data = path.read_bytes() if stat.S_ISREG(found.st_mode) else b""
        out[str(path.relative_to(folder))] = (found.st_mode, data)
    return out


# -- cache-folder -------------------------------------------------------------------------

INDEX_FILES = ("index.sqlite3", "index.sqlite3-wal", "index.sqlite3-shm",
               "index.sqlite3-journal")


def _places(cache: Path) -> list[Path]:
    entry = fuzz_cache.entry_file(cache, KEYS[0])
    return [*(cache / n for n in INDEX_FILES), cache / "key", cache / "data", entry.parent,
            entry, cache / "locks", cache / "tmp", cache / "locks" / f"{TOKEN}.lock",
            cache / "tmp" / TOKEN]


def _inside(cache: Path, where: Path) -> bool:
    """Whether every folder between ``cache`` and ``where`` is a real folder of the cache (a
    step that goes through a planted link would have this harness write outside)."""
    for parent in where.relative_to(cache).parents:
        step = cache / parent
        if step.is_symlink() or (step.exists() and not step.is_dir()):
            return False
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _link(plan: Plan, cache: Path, outside: Path) -> None:
    where = plan.pick(_places(cache))
    to = plan.pick([outside / "notes", outside / "folder", outside / "missing",
                    Path("/dev/zero"), cache, cache / "data"])
    if not _inside(cache, where):
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    _remove(where)
    where.symlink_to(to)


def _odd_file(plan: Plan, cache: Path, outside: Path) -> None:
    where = plan.pick(_places(cache))
    how = plan.pick(["fifo", "hardlink", "folder", "file"])
    if not _inside(cache, where):
        return
    where.parent.mkdir(parents=True, exist_ok=True)
    _remove(where)
    if how == "fifo":
        os.mkfifo(where)
    elif how == "hardlink":
        os.link(outside / "notes", where)
    elif how == "folder":
        where.mkdir()
    else:
        where.write_bytes(bytes(plan.byte() for _ in range(plan.byte() % 64)))


def _forge(plan: Plan, cache: Path, outside: Path) -> None:
    path = fuzz_cache.entry_file(cache, plan.pick(KEYS))
    key = path.name.removesuffix(".rec")
    evil = bytes([plan.byte()]) * SIZE
    how = plan.pick(["digest-and-crc", "mac-of-another-key", "the-other-entry"])
    if how == "digest-and-crc":
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        blob = struct.pack("<4s16sIQ", b"SFC2", digest, google_crc32c.value(evil), SIZE) + evil
    elif how == "mac-of-another-key":
        mac = hmac.new(b"f" * 32, key.encode() + b"\0" + SIZE.to_bytes(8, "little") + evil,
                       hashlib.sha256).digest()
        blob = struct.pack("<4s32sQ", b"SFC3", mac, SIZE) + evil
    else:
        other = fuzz_cache.entry_file(cache, KEYS[1 - KEYS.index(key)])
        blob = other.read_bytes() if other.is_file() and not other.is_symlink() else evil
    if _inside(cache, path) and path.parent.is_dir():
        _remove(path)
        path.write_bytes(blob)


def _key(plan: Plan, cache: Path, outside: Path) -> None:
    key = cache / "key"
    how = plan.pick(["short", "other", "readable", "removed"])
    if not key.is_file() or key.is_symlink() or key.stat().st_nlink > 1:
        return
    if how == "short":
        data = b"k" * (plan.byte() % 40)
    elif how == "other":
        data = bytes(plan.byte() for _ in range(32))
    elif how == "readable":
        os.chmod(key, 0o644)
        return
    key.unlink()
    if how != "removed":
        key.write_bytes(data)
        os.chmod(key, 0o600)


def _chmod(plan: Plan, cache: Path, outside: Path) -> None:
    os.chmod(cache, plan.pick([0o777, 0o1777, 0o770, 0o2770, 0o700, 0o755]))


def _rows(plan: Plan, cache: Path, outside: Path) -> None:
    holder = plan.pick(["", "1", "../../outside/notes", TOKEN, "../outside", "x" * 300])
    pid = plan.pick([1, os.getpid(), 0, -1])
    key = plan.pick([*KEYS, "other"])
    for name in INDEX_FILES:  # this harness's own SQLite would write through a planted link
        path = cache / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            return
        if path.exists() and path.stat().st_nlink > 1:
            return
    with contextlib.suppress(sqlite3.Error):
        db = sqlite3.connect(cache / "index.sqlite3", timeout=1)
        try:
            db.execute("INSERT OR REPLACE INTO entries (key, url, size, next_use, seq, ready, "
                       "pid, holder) VALUES (?, ?, ?, 5, 0, 0, ?, ?)",
                       (key, URL, SIZE, pid, holder))
            db.commit()
        finally:
            db.close()


def _junk(plan: Plan, cache: Path, outside: Path) -> None:
    locks, temps = cache / "locks", cache / "tmp"
    how = plan.pick(["unlocked", "folder-lock", "stillborn", "temp-file", "dead-temps",
                     "old-temp"])
    entry = fuzz_cache.entry_file(cache, KEYS[0])
    places = {"unlocked": locks / f"{TOKEN}.lock", "folder-lock": locks / f"{TOKEN}.lock",
              "stillborn": locks / f".{TOKEN}.new", "temp-file": temps / TOKEN,
              "dead-temps": temps / TOKEN / "x.rec.1",
              "old-temp": entry.parent / f"{entry.name}.tmp-1-2"}
    where = places[how]
    if not _inside(cache, where):
        return
    with contextlib.suppress(OSError):
        where.parent.mkdir(parents=True, exist_ok=True)
        _remove(where if how != "dead-temps" else where.parent)
        if how == "unlocked":
            (locks / f"{TOKEN}.lock").write_bytes(b"")
        elif how == "folder-lock":
            (locks / f"{TOKEN}.lock").mkdir()
        elif how == "stillborn":
            (locks / f".{TOKEN}.new").write_bytes(b"")
        elif how == "temp-file":
            (temps / TOKEN).write_bytes(b"t" * 100)
        elif how == "dead-temps":
            (temps / TOKEN).mkdir()
            (temps / TOKEN / "x.rec.1").write_bytes(b"t" * 5000)
        else:
            where.write_bytes(b"t" * 5000)


ACTIONS = (_link, _odd_file, _forge, _key, _chmod, _rows, _junk)


def hostile_folder(data: bytes, live: Path) -> None:
    """A cache changed by the plan ``data``, then used (see the module docstring)."""
    plan = Plan(data)
    live.mkdir()
    outside = live / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "notes").write_bytes(b"the user's own")
    os.chmod(outside / "notes", 0o600)
    cache = live / "cache"
    fuzz_cache._fill(cache).close()
    before = _snapshot(outside)
    for _ in range(1 + plan.byte() % 4):
        plan.pick(ACTIONS)(plan, cache, outside)
    trusted = bool(plan.byte() % 2)
    for _ in range(2):  # used, then opened again after what the first use changed
        opened = _quietly(lambda: DiskCache(cache, max_bytes=1 << 20, trust_folder=trusted))
        if opened is not None:
            _use(opened)
    if _snapshot(outside) != before:
        raise AssertionError("the cache changed files outside its folder")


def _use(cache: DiskCache) -> None:
    keys = list(KEYS)
    try:
        _check_read(_quietly(lambda: cache.get_many(keys)), keys)
        started = time.monotonic()
        got = _quietly(lambda: cache.await_entries([(k, SIZE) for k in keys], seconds=0.05))
        if time.monotonic() - started > 0.05 + MARGIN_SECONDS:
            raise AssertionError("a wait ran past its deadline")
        _check_read(got, keys)
        _quietly(lambda: cache.put_many([(k, URL, r, 1) for k, r in zip(keys, RECORDS)]))
        _check_read(_quietly(lambda: cache.get_many(keys)), keys)
        _quietly(cache.verify)
        _quietly(cache.summary)
    finally:
        _quietly(cache.close)


# -- cache-holders ------------------------------------------------------------------------

ACTS = ("stop", "stop-mid-write", "die", "die-mid-write", "exit", "fill", "close")


def holders(data: bytes, live: Path) -> None:
    """Holders forked and stopped or killed as the plan ``data`` says; then a reader."""
    plan = Plan(data)
    cache = live / "cache"
    live.mkdir()
    DiskCache(cache, max_bytes=1 << 20).close()
    kids: list[tuple[int, str]] = []
    try:
        for _ in range(1 + plan.byte() % 2):
            keys = [k for k, bit in zip(KEYS, (1, 2)) if plan.byte() & bit] or [KEYS[0]]
            act = plan.pick(ACTS)
            pid = os.fork()
            if pid == 0:
                _holder(cache, keys, act)  # never returns
            kids.append((pid, _settled(pid, act)))
        deadline = plan.pick((0.005, 0.015))
        reader = DiskCache(cache, max_bytes=1 << 20)
        try:
            for limit in (deadline, 5.0):  # the second wait: nobody to wait for any more
                started = time.monotonic()
                got = _quietly(lambda: reader.await_entries([(k, SIZE) for k in KEYS],
                                                            seconds=limit))  # noqa: B023
                took = time.monotonic() - started
                if took > min(limit, deadline) + MARGIN_SECONDS:
                    raise AssertionError(f"a wait of {limit} s took {took:.2f} s")
                _check_read(got, KEYS)
        finally:
            reader.close()
    finally:
        for pid, state in kids:
            if state != "ended":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    after = DiskCache(cache, max_bytes=1 << 20)
    try:
        summary = after.summary()
        if summary.reserved or summary.temp_bytes:
            raise AssertionError(f"dead holders left {summary.reserved} reservations and "
                                 f"{summary.temp_bytes} bytes of temp files")
        left = [p for p in (cache / "tmp").rglob("*") if p.is_file()]
        if left:
            raise AssertionError(f"temp files of dead holders left: {left}")
        after.put_many([(k, URL, r, 1) for k, r in zip(KEYS, RECORDS)])  # or filled already
        got = after.get_many(list(KEYS))
        _check_read(got, KEYS)
        if None in got:
            raise AssertionError("the cache keeps nothing after its holders died")
    finally:
        after.close()


def _settled(pid: int, act: str) -> str:
    """Wait for the forked holder to stop or end: "stopped" or "ended"."""
    end = time.monotonic() + HOLDER_SECONDS
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done:
            if os.WIFSTOPPED(status):
                return "stopped"
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
                raise AssertionError(f"a holder ({act}) raised something but a ShardfeedError")
            return "ended"
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"a holder ({act}) hung for {HOLDER_SECONDS} s")


def _holder(cache: Path, keys: list[str], act: str) -> None:
    """The forked holder's life: reserve ``keys``, then ``act``. Never returns."""
    code = 0
    try:
        held = DiskCache(cache, max_bytes=1 << 20)
        kept = held.reserve([(k, URL, SIZE, 0) for k in keys], now=0)
        mine = [k for k, ok in zip(keys, kept) if ok]
        if act in ("stop", "die"):
            os.kill(os.getpid(), signal.SIGSTOP if act == "stop" else signal.SIGKILL)
        elif act.endswith("mid-write"):
            how = signal.SIGSTOP if act.startswith("stop") else signal.SIGKILL
            real, calls = os.write, [0]

            def write(fd: int, data: Any) -> int:
                calls[0] += 1
                if calls[0] == 2:  # the header is out, half the bytes: stopped here
                    real(fd, bytes(data[: len(data) // 2]))
                    os.kill(os.getpid(), how)
                return real(fd, data)

            os.write = write
            for key in mine:
                held.fill(key, RECORDS[KEYS.index(key)])
        elif act == "fill":
            for key in mine:
                held.fill(key, RECORDS[KEYS.index(key)])
        elif act == "close":
            held.close()
        # "exit": ends holding what it reserved
    except ShardfeedError:
        pass
    except BaseException:  # noqa: BLE001 - reported by the parent as a finding
        code = 3
    os._exit(code)
