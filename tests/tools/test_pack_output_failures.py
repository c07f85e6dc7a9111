"""pack when its output folder fails it: a full disk, a folder it may not write into.

A full disk is simulated by making ``fsync`` of one index report ENOSPC (what a
delayed-allocation file system does when the disk filled while the file was written).

A read-only folder is real: ``chmod 0o555``, and the CLI run in a child process. Run as
root (as the tests may be), permission bits bind only without the capabilities that let
root ignore them, so the child drops CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER
from its bounding set and then execs the command, which runs without them (it stays root
otherwise; non-root runs need no help).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.cli.main import main
from shardfeed.tools.pack import pack

QUIET = ["--no-progress"]
_PR_CAPBSET_DROP = 24
_DAC_CAPABILITIES = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


def test_disk_full_while_an_index_is_written(
    class_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clean = tmp_path / "clean"
    pack(class_folder, clean, records_per_shard=4)
    out = tmp_path / "out"
    real = os.fsync

    def fsync(fd: int) -> None:
        if "shard-00001-of-00003.tfrecord.idx.npy" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    args = ["pack", str(class_folder), str(out), "--records-per-shard", "4", *QUIET]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "disk is full" in err[0] and "shard-00001-of-00003.tfrecord.idx.npy" in err[0]
    assert "--resume" in err[0]
    names = sorted(os.listdir(out))
    assert not [n for n in names if n.endswith(".tmp") or "shard-00001" in n]
    assert [n for n in names if not n.startswith(".")] == [
        "shard-00000-of-00003.tfrecord", "shard-00000-of-00003.tfrecord.idx",
        "shard-00000-of-00003.tfrecord.idx.npy"]
    monkeypatch.undo()  # space was freed
    assert main([*args, "--resume"]) == 0
    assert {n: (out / n).read_bytes() for n in os.listdir(clean)} == {
        n: (clean / n).read_bytes() for n in os.listdir(clean)}


_DROP_THEN_RUN = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for cap in {_DAC_CAPABILITIES}:
    if libc.prctl({_PR_CAPBSET_DROP}, cap, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
os.execv(sys.executable, [sys.executable, "-m", "shardfeed", *sys.argv[1:]])
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``shardfeed ...`` in a child process that file permissions bind (as root: one that
    drops the capabilities to ignore them, then starts the command)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    start = ["-c", _DROP_THEN_RUN] if os.geteuid() == 0 else ["-m", "shardfeed"]
    return subprocess.run([sys.executable, *start, *args], capture_output=True, text=True,
                          env=env, check=False, timeout=120)


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_read_only_output_folder_gives_one_line(class_folder: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = tmp_path / "done"
    pack(class_folder, done, records_per_shard=4)
    locked = tmp_path / "locked"
    locked.mkdir()
    before = _listing(done)
    for folder in (empty, done, locked):
        folder.chmod(0o555)
    try:
        runs = {
            empty: _cli("pack", str(class_folder), str(empty), *QUIET),
            done: _cli("pack", str(class_folder), str(done), "--overwrite",
                       "--records-per-shard", "2", *QUIET),
            locked: _cli("pack", str(class_folder), str(locked / "new"), *QUIET),
        }
    finally:
        for folder in (empty, done, locked):
            folder.chmod(0o755)
    expected = {
        empty: f"cannot write into the output folder '{empty}'",
        done: f"cannot write into the output folder '{done}'",
        locked: f"cannot create the output folder '{locked / 'new'}'",
    }
    for folder, run in runs.items():
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1, run.stderr
        assert len(lines) == 1, run.stderr
        assert lines[0].startswith(f"shardfeed pack: error: {expected[folder]}"), lines[0]
        assert "permission denied: make" in lines[0] and "writable" in lines[0]
    assert _listing(done) == before  # nothing of the earlier pack was removed
    assert os.listdir(empty) == [] and os.listdir(locked) == []
