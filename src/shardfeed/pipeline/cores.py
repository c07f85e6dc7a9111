"""The cores this process may run on: its CPU affinity, and its control group's CPU quota.

A container's CPU limit is most often a quota of CPU time, not a set of CPUs: Kubernetes'
``limits.cpu`` and ``docker run --cpus`` write it as cgroup v2's ``cpu.max`` (``"400000
100000"``: 4 cores' time a period) or v1's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``.
``os.cpu_count()`` and the affinity then read the node's 64 cores where the process gets 4
cores' worth, and everything sized by cores (the slice gate, the stage figures' verdict,
Patches' decode threads, the CLI's workers) would plan for 64. :func:`usable_cores` takes the
smaller of the affinity and the quota, rounded up (1.5 cores' time runs 2 threads side by
side part of the time), never below 1.

The quota is read once a process, from the control groups ``/proc/self/cgroup`` names, the
process's own and each above it (a limit set on a parent holds for its children), under
``/sys/fs/cgroup`` only: a path with ``..`` in it is not followed. Where none is set, or the
files cannot be read (not Linux, no cgroup file system), the affinity alone counts.

Determinism: none of this changes an output. State: the quota, once read. Memory: none.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path, PurePosixPath

__all__ = ["cgroup_cpu_limit", "usable_cores"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (which a container's CPU set or
    ``taskset`` may set below the machine's count), and at most its control group's CPU
    quota (:func:`cgroup_cpu_limit`)."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, limit)
    return max(1, cores)


@functools.cache
def cgroup_cpu_limit() -> int | None:
    """The cores' worth of CPU time this process's control groups allow, rounded up; None
    where none is set or it cannot be read (read once a process)."""
    return cpu_limit(PROC_CGROUP, CGROUP_ROOT)


def cpu_limit(proc_cgroup: Path, root: Path) -> int | None:
    """The tightest CPU quota of the control groups that ``proc_cgroup`` (a
    ``/proc/<pid>/cgroup`` file) names, under ``root``, and of each group above them: cores'
    worth, rounded up; None where none is set or nothing can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    limits: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:  # v2: one hierarchy, cpu.max in each group
            for group in _groups(root, path):
                limits.extend(_v2_limit(group))
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's hierarchy
            for mount in dict.fromkeys((root / controllers, root / "cpu")):
                # a container's own group is often the mount's root, whatever the path says
                for group in dict.fromkeys((*_groups(mount, path), mount)):
                    limits.extend(_v1_limit(group))
    return min(limits) if limits else None


def _groups(root: Path, path: str) -> list[Path]:
    """The group ``path`` under ``root`` and those above it up to ``root``; none where the
    path is not a plain absolute one (``..`` in it)."""
    pure = PurePosixPath(path.strip())
    if not pure.is_absolute() or ".." in pure.parts:
        return []
    parts = pure.parts[1:]
    return [root.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_limit(group: Path) -> list[int]:
    """``cpu.max`` of ``group`` in cores (``"max 100000"``: none)."""
    try:
        quota, period = (group / "cpu.max").read_text().split()[:2]
        return [_cores(int(quota), int(period))] if quota != "max" else []
    except (OSError, ValueError, UnicodeDecodeError):
        return []


def _v1_limit(group: Path) -> list[int]:
    """``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` of ``group`` in cores (-1: none)."""
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
        return [_cores(quota, period)] if quota != -1 else []
    except (OSError, ValueError, UnicodeDecodeError):
        return []


def _cores(quota: int, period: int) -> int:
    """Cores' worth of ``quota`` a ``period``, rounded up; ValueError where either is not
    positive (not a quota the kernel writes)."""
    if quota <= 0 or period <= 0:
        raise ValueError("not a quota")
    return max(1, math.ceil(quota / period))
