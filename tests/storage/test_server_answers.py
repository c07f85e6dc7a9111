"""The fuzz target for server answers (fuzz_server_answers.py) as part of the suite: in a
fresh process, 80 seeded hostile answers through every road; only the true bytes or a
StorageError may come back, in time, in bounded memory, with no credential sent to another
host."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("obstore")


def test_hostile_answers_give_the_bytes_or_a_storage_error() -> None:
    here = Path(__file__).resolve().parent
    env = {**os.environ, "SHARDFEED_FUZZ_CASES": "80"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         str(here / "fuzz_server_answers.py")],
        check=False, capture_output=True, text=True, env=env, timeout=400, cwd=here.parents[1])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
