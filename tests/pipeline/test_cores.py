"""The cores a process may use: its affinity, and at most its control group's CPU quota (a
container's ``--cpus`` or Kubernetes ``limits.cpu``), read from cgroup v2's ``cpu.max`` or
v1's CFS quota, in its own group or any above it; never a path outside the cgroup root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.pipeline import cores
from shardfeed.pipeline.cores import cpu_limit


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _proc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-cgroup"
    path.write_text(text)
    return path


def test_a_v2_quota_in_the_group_or_above_it_limits_the_cores(tmp_path: Path) -> None:
    root = _tree(tmp_path / "fs", {
        "cpu.max": "max 100000\n",
        "kubepods/cpu.max": "1600000 100000\n",  # the node's pods: 16 cores
        "kubepods/pod1/cpu.max": "max 100000\n",
        "kubepods/pod1/ctr/cpu.max": "150000 100000\n",  # the container: 1.5 cores' time
    })
    proc = _proc(tmp_path, "0::/kubepods/pod1/ctr\n")
    assert cpu_limit(proc, root) == 2  # rounded up
    (root / "kubepods/pod1/ctr/cpu.max").write_text("max 100000\n")
    assert cpu_limit(proc, root) == 16  # the parent's
    (root / "kubepods/cpu.max").write_text("max 100000\n")
    assert cpu_limit(proc, root) is None  # none set anywhere
    # a container's own namespace: its group is the root
    assert cpu_limit(_proc(tmp_path, "0::/\n"), _tree(tmp_path / "ns", {
        "cpu.max": "400000 100000"})) == 4


def test_a_v1_cfs_quota_limits_the_cores(tmp_path: Path) -> None:
    root = _tree(tmp_path / "fs", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "memory/docker/abc/cpu.cfs_quota_us": "100000\n",  # another controller's: not read
        "memory/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n"
    assert cpu_limit(_proc(tmp_path, text), root) == 3
    # inside the container the hierarchy's root is its own group, whatever the path says
    inside = _tree(tmp_path / "inside", {"cpu,cpuacct/cpu.cfs_quota_us": "250000",
                                         "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cpu_limit(_proc(tmp_path, text), inside) == 3
    unlimited = _tree(tmp_path / "host", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                                          "cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cpu_limit(_proc(tmp_path, text), unlimited) is None


@pytest.mark.parametrize("text", [
    "0::/../../etc\n",       # never outside the root
    "0::relative/group\n",   # not an absolute path
    "garbage\n",
    "0::/ctr\n",             # files missing
    "",
])
def test_what_cannot_be_read_leaves_the_affinity_alone(tmp_path: Path, text: str) -> None:
    outside = _tree(tmp_path, {"etc/cpu.max": "100000 100000", "fs/x": ""})
    assert cpu_limit(_proc(tmp_path, text), outside / "fs" / "sub") is None
    assert cpu_limit(tmp_path / "no-such-file", outside) is None


def test_a_bad_quota_is_not_one(tmp_path: Path) -> None:
    for text in ("0 100000", "100000 0", "many 100000", "-5 100000", ""):
        root = _tree(tmp_path / "fs", {"cpu.max": text})
        assert cpu_limit(_proc(tmp_path, "0::/\n"), root) is None, text


def test_usable_cores_are_the_affinity_within_the_quota(
        monkeypatch: pytest.MonkeyPatch) -> None:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: None)
    assert cores.usable_cores() == affinity
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: 1)
    assert cores.usable_cores() == 1
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda: affinity + 64)
    assert cores.usable_cores() == affinity


def test_a_fresh_process_reads_its_own_groups() -> None:
    """As a user's process does: this machine's own answer, whatever its cgroups say (the
    affinity where none is set), and never more than the affinity."""
    code = ("from shardfeed.pipeline.cores import usable_cores, cgroup_cpu_limit; import os; "
            "print(usable_cores(), cgroup_cpu_limit(), len(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    used, limit, affinity = int(out[0]), out[1], int(out[2])
    assert 1 <= used <= affinity
    assert used == (affinity if limit == "None" else min(affinity, int(limit)))
