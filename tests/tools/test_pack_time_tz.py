"""Naive ISO timestamps are UTC wherever the packing machine is: packed in New York or in
India (``TZ`` away from UTC, in this process and in a fresh ``shardfeed pack``), a day of
frames gets the same order keys and the same windows as packed in UTC."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardfeed
from shardfeed.cli.main import main
from shardfeed.tools.pack.time import iso_nanos

# POSIX TZ strings (no tz database needed): India, UTC+5:30 all year; New York, UTC-5 in
# winter and UTC-4 from March to November.
ZONES = ["IST-5:30", "EST+5EDT,M3.2.0,M11.1.0"]
NOON_MAY_1 = 1_714_564_800  # 2024-05-01T12:00:00 UTC, in seconds since 1970


def _set_tz(value: str | None) -> None:
    if value is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = value
    time.tzset()


@pytest.fixture(params=ZONES)
def away_from_utc(request: pytest.FixtureRequest) -> Iterator[str]:
    """This process's local time zone set to one away from UTC, restored afterwards."""
    before = os.environ.get("TZ")
    _set_tz(request.param)
    try:
        assert time.localtime(NOON_MAY_1).tm_hour != 12  # the zone is really in effect
        yield request.param
    finally:
        _set_tz(before)


def _frames(tmp_path: Path, make_image, stamps: list[str]) -> Path:  # type: ignore[no-untyped-def]
    lines = ["path,day,t"]
    for i, stamp in enumerate(stamps):
        make_image(tmp_path / f"f{i}.jpg", 70 + i, size=(8, 8))
        lines.append(f"f{i}.jpg,1,{stamp}")
    path = tmp_path / "frames.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


NAIVE = [f"2024-05-01T12:00:{8 * i:02d}" for i in range(5)]  # a camera's clock, in UTC


def _keys(folder: Path) -> tuple[list[int], list[float], list[list[int]]]:
    """The stored int64 nanoseconds, the manifest's seconds and the 16 s windows."""
    ds = shardfeed.Dataset(str(folder))
    try:
        assert ds.order_keys is not None
        stored = [int(ds[i]["t"][0]) for i in range(len(ds))]
        windows = shardfeed.Windows(ds, length=2, stride_seconds=16.0)
        frames = [windows.index.frames(w).tolist() for w in range(len(windows))]
        return stored, ds.order_keys.tolist(), frames
    finally:
        ds.close()


def test_naive_timestamps_are_read_as_utc_away_from_utc(
    away_from_utc: str, tmp_path: Path, make_image  # type: ignore[no-untyped-def]
) -> None:
    csv = _frames(tmp_path, make_image, NAIVE)
    assert main(["pack", str(csv), str(tmp_path / "out"), "--csv-group", "day",
                 "--csv-order", "t", "--no-progress"]) == 0
    stored, seconds, windows = _keys(tmp_path / "out")
    assert stored == [(NOON_MAY_1 + 8 * i) * 10**9 for i in range(5)]
    assert seconds == [float(NOON_MAY_1 + 8 * i) for i in range(5)]
    assert windows == [[0, 2], [1, 3], [2, 4]]
    # the same instants written with a zone give the same keys
    assert iso_nanos("2024-05-01T12:00:00") == iso_nanos("2024-05-01T12:00:00Z") \
        == iso_nanos("2024-05-01T17:30:00+05:30") == NOON_MAY_1 * 10**9


def test_a_fresh_pack_under_another_tz_writes_what_utc_writes(
    tmp_path: Path, make_image  # type: ignore[no-untyped-def]
) -> None:
    """``TZ`` set before the process starts, as a user's shell has it."""
    csv = _frames(tmp_path, make_image, NAIVE)
    results = {}
    for zone in ["UTC", *ZONES]:
        out = tmp_path / f"out-{len(results)}"
        env = {**os.environ, "TZ": zone}
        done = subprocess.run(
            [sys.executable, "-m", "shardfeed", "pack", str(csv), str(out), "--csv-group",
             "day", "--csv-order", "t", "--no-progress"],
            env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        results[zone] = _keys(out)
    assert results["UTC"][0][0] == NOON_MAY_1 * 10**9
    for zone in ZONES:
        assert results[zone] == results["UTC"], zone
    assert np.diff(results["UTC"][1]).tolist() == [8.0] * 4
