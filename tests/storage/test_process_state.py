"""The storage package's process-wide state: kept by its two holders (and thread pools that
follow the fork rule) only, and a forked child starts with none of what its parent made,
keeps what the user set, and knows whether obstore ran before the fork."""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import datetime
import enum
import importlib
import json
import logging
import os
import pkgutil
import re
import struct
import subprocess
import sys
import textwrap
import threading
import types
import typing
from pathlib import Path

import shardfeed.storage
from shardfeed.storage.daemon_threads import DaemonThreads
from shardfeed.storage.process_state import PROCESS, SETTINGS, ProcessState

PACKAGE = Path(shardfeed.storage.__file__).parent
_SRC = str(Path(__file__).resolve().parents[2] / "src")


def _modules() -> list[types.ModuleType]:
    names = [f"shardfeed.storage.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE)])]
    return [shardfeed.storage, *(importlib.import_module(n) for n in sorted(names))]


def _constant(value: object) -> bool:
    """Whether ``value`` cannot hold state of this package's: a number, a text, a pattern, a
    type, a function (not one with a cache: ``functools.cache`` keeps state), a type alias,
    a logger (its settings are the user's), or a tuple, read-only mapping or frozen
    dataclass of constants."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, re.Pattern,
                                            contextvars.ContextVar, typing.TypeVar, enum.Enum,
                                            type, types.FunctionType, types.ModuleType,
                                            types.GenericAlias, types.UnionType, struct.Struct,
                                            datetime.timedelta, logging.Logger)):
        return True
    if type(value).__module__ in ("typing", "__future__"):  # Optional[...], annotations
        return True
    if hasattr(value, "cache_info"):  # functools' caches: state, unless the library's own
        return not str(getattr(value, "__module__", "")).startswith("shardfeed")
    if isinstance(value, (tuple, frozenset)):
        return all(_constant(v) for v in value)
    if isinstance(value, types.MappingProxyType):
        return all(_constant(k) and _constant(v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and value.__dataclass_params__.frozen:  # type: ignore[union-attr]
        return all(_constant(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


def test_process_wide_state_is_kept_by_the_holders_only() -> None:
    """A dict, list, set, lock, flag object or any other mutable value at module level in
    the storage package is one of the two holders, a field of one (an alias), or a thread
    pool that follows the fork rule; anything else is a new holder outside the owner."""
    owned = {id(v) for holder in (PROCESS, SETTINGS) for v in vars(holder).values()}
    found = []
    for module in _modules():
        for name, value in vars(module).items():
            if name.startswith("__") or _constant(value):
                continue
            if value is PROCESS or value is SETTINGS or id(value) in owned:
                continue
            if isinstance(value, DaemonThreads) and value in PROCESS._resets:
                continue
            found.append(f"{module.__name__}.{name} ({type(value).__name__})")
    assert found == [], ("process-wide state outside shardfeed.storage.process_state: "
                         f"{found}; keep it in PROCESS or SETTINGS")


def test_one_fork_hook_and_no_pid_checks() -> None:
    """The fork rule is process_state's one hook: no module of the storage package rebinds a
    global (a flag of its own), and no module of the whole package registers another hook or
    compares pids (one that did missed what a fork leaves behind: a lock a parent's thread
    held, calls in flight)."""
    for path in sorted(PACKAGE.parent.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if path.parent == PACKAGE:
                assert not isinstance(node, ast.Global), f"{path.name}:{node.lineno} global"
            if isinstance(node, ast.Attribute) and node.attr == "register_at_fork":
                assert path.name == "process_state.py", f"{path.name}:{node.lineno}"
            if isinstance(node, ast.Compare):
                called = [n.func.attr for n in ast.walk(node)
                          if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
                assert "getpid" not in called, f"{path.name}:{node.lineno} compares pids"


def test_an_entry_is_made_once_and_a_failure_is_not_kept() -> None:
    state = ProcessState()
    calls: list[int] = []
    gate = threading.Barrier(8, timeout=10)

    def make() -> str:
        calls.append(1)
        return "store"

    def ask() -> None:
        gate.wait()
        assert state.once(state.regions, ("", "bucket"), make) == "store"

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(calls) == 1 and state.regions == {("", "bucket"): "store"}

    def fail() -> str:
        raise OSError("no answer")

    for _ in range(2):
        try:
            state.once(state.regions, ("", "other"), fail)
        except OSError:
            pass
    assert ("", "other") not in state.regions
    assert state.once(state.regions, ("", "other"), lambda: "eu-west-1") == "eu-west-1"


CHILD = r"""
import json, os, threading
from shardfeed.storage import ByteCache, index_cache, redirect_guard, set_index_cache
from shardfeed.storage.backends import obstore_backend
from shardfeed.storage.inflight import CallGroup
from shardfeed.storage.obstore_stores import _store, forked_after_use, installed
from shardfeed.storage.options import set_storage_options, storage_options_for
from shardfeed.storage.process_state import PROCESS, SETTINGS


def in_child(report):
    # the parent's holder of the locks did not follow the fork: they must be free here
    with PROCESS.lock, SETTINGS.lock:
        seen = {"stores": len(PROCESS.stores), "regions": len(PROCESS.regions),
                "ports": len(PROCESS.ports), "refused": len(PROCESS.refused),
                "wakes": len(PROCESS.wakes)}
    seen["forked_after_use"] = forked_after_use()
    seen["options"] = storage_options_for("s3://bucket/x")
    seen["index_cache"] = index_cache() is not None
    seen["provider"] = SETTINGS.obstore_provider is not None
    seen["own_refuser"] = redirect_guard.refuser_port() not in (0, parent_port)
    report(seen)


def forked(run):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            run(lambda seen: os.write(w, json.dumps(seen).encode()))
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)


set_storage_options("s3://bucket/", anon=True)
set_index_cache(ByteCache(max_bytes=1000))
parent_port = redirect_guard.refuser_port()
before = forked(in_child)  # obstore not used yet

if installed():  # a store made (no request is sent until a call)
    _store("s3://bucket/key", {"anon": True, "endpoint_url": "http://127.0.0.1:9"}, 5.0)
with PROCESS.lock:
    PROCESS.regions[("http://127.0.0.1:9", "bucket")] = "eu-west-1"
    PROCESS.refused.append("elsewhere.example")
wake = CallGroup().enter()  # a call in flight
held, release = threading.Event(), threading.Event()


def hold():
    with PROCESS.lock, SETTINGS.lock:
        held.set()
        release.wait()


threading.Thread(target=hold, daemon=True).start()
held.wait()
after = forked(in_child)  # forked while another thread holds both locks
release.set()
print(json.dumps({"installed": installed(), "before": before, "after": after,
                  "parent_stores": len(PROCESS.stores), "parent_wakes": len(PROCESS.wakes)}))
"""


def test_a_forked_child_starts_with_empty_caches_and_keeps_the_settings() -> None:
    env = {**os.environ, "PYTHONPATH": _SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], check=False,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    made = {"stores": 0, "ports": 0, "wakes": 0}  # the parent's: none in a child
    kept = {"options": {"anon": True}, "index_cache": True, "provider": True,
            "own_refuser": True}
    assert out["before"] == {**made, **kept, "regions": 0, "refused": 0,
                             "forked_after_use": False}
    assert out["after"] == {**made, **kept, "regions": 1, "refused": 1,  # learnt: kept
                            "forked_after_use": out["installed"]}
    assert out["parent_stores"] == int(out["installed"]) and out["parent_wakes"] == 1
