"""Four real processes under torch.distributed (gloo, 127.0.0.1): shares, padding, resume.

The ranks are started once (see rank_worker.py); they read whole epochs with
``remainder="drop"`` and ``"pad"``, save the state after 2 steps, then the job continues on
2 and on 3 ranks. Every Loader detects its rank from the process group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import RECORDS

from shardfeed import Dataset, Loader

pytest.importorskip("torch.distributed")

WORKER = Path(__file__).resolve().parent / "rank_worker.py"
WORLD = 4
BATCH, SEED, STEPS_BEFORE = 2, 5, 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def job(records_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the 4-rank job once; return {"phase<W>": [result of rank 0, 1, ...]}."""
    out = tmp_path_factory.mktemp("dist-out")
    port = _free_port()  # phase 1's; rank 0 holds the later phases' (see rank_worker.py)
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(WORLD), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), str(records_folder), str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    logs: list[str] = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=120)[0])
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        logs = [proc.communicate()[0] or "" for proc in procs]
        pytest.fail(f"the ranks did not finish in 120 s; their output: "
                    f"{[(r, log[-2000:]) for r, log in enumerate(logs)]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [(r, p.returncode, logs[r][-3000:]) for r, p in enumerate(procs) if p.returncode]
    assert not failed, f"rank processes failed: {failed}"
    return {
        f"phase{w}": [json.loads((out / f"phase{w}-rank{r}.json").read_text())
                      for r in range(w)]
        for w in (WORLD, 2, 3)
    }


@pytest.fixture(scope="module")
def order(records_folder: Path) -> list[int]:
    """Record id at each epoch position, from one process reading the whole epoch."""
    with Dataset(records_folder) as ds, Loader(ds, batch_size=RECORDS, seed=SEED,
                                               transform=None, rank=0, world_size=1) as loader:
        return [int(i) for b in loader for i in b["index"].tolist()]


def test_ranks_come_from_the_process_group(job: dict[str, Any]) -> None:
    for w in (WORLD, 2, 3):
        results = job[f"phase{w}"]
        assert [(r["rank"], r["world_size"], r["source"]) for r in results] == [
            (rank, w, "torch") for rank in range(w)
        ]
    assert [r["ranks_drop"] for r in job["phase4"]] == [[k, WORLD] for k in range(WORLD)]


def test_drop_gives_disjoint_equal_shares_of_the_epoch(job: dict[str, Any],
                                                       order: list[int]) -> None:
    shares = [r["epoch_drop"] for r in job["phase4"]]
    assert [len(s) for s in shares] == [RECORDS // WORLD] * WORLD
    union = [i for s in shares for i in s]
    assert len(set(union)) == len(union)  # no record twice
    kept = RECORDS - RECORDS % WORLD
    assert set(union) == set(order[:kept])  # the epoch's last n mod W positions left out
    for rank, share in enumerate(shares):
        assert share == order[rank:kept:WORLD]  # interleaved: a prefix after every step


def test_pad_gives_every_record_and_equal_shares(job: dict[str, Any], order: list[int]) -> None:
    shares = [r["epoch_pad"] for r in job["phase4"]]
    per_rank = -(-RECORDS // WORLD)
    assert [len(s) for s in shares] == [per_rank] * WORLD
    counts = Counter(i for s in shares for i in s)
    assert set(counts) == set(range(RECORDS))
    extra = per_rank * WORLD - RECORDS
    assert sorted(i for i, c in counts.items() if c == 2) == sorted(order[:extra])
    for result in job["phase4"]:
        assert result["after_epoch_pad"]["epoch"] == 1
        assert result["after_epoch_pad"]["consumed"] == 0


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_every_rank_saves_the_same_global_state(job: dict[str, Any], remainder: str) -> None:
    states = [r[f"state_{remainder}"] for r in job["phase4"]]
    assert all(s == states[0] for s in states)
    assert states[0]["consumed"] == STEPS_BEFORE * BATCH * WORLD
    assert states[0]["epoch"] == 0


@pytest.mark.parametrize("new_world", [2, 3])
@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_resume_on_fewer_ranks_reads_the_rest_once(
    job: dict[str, Any], order: list[int], remainder: str, new_world: int
) -> None:
    consumed = STEPS_BEFORE * BATCH * WORLD
    before = [i for r in job["phase4"] for i in r[f"before_{remainder}"]]
    shares = [r[f"after_{remainder}"] for r in job[f"phase{new_world}"]]
    assert len({len(s) for s in shares}) == 1  # equal counts on the new ranks too
    after = [i for s in shares for i in s]
    assert sorted(before) == sorted(order[:consumed])
    left = RECORDS - consumed
    if remainder == "drop":
        expected = order[consumed : RECORDS - left % new_world]
    else:
        expected = order[consumed:] + order[: -left % new_world]
    assert sorted(after) == sorted(expected)
    if remainder == "drop":  # before + after: a prefix of the epoch, each record once
        both = before + after
        assert len(both) == len(set(both))
        assert set(both) == set(order[: RECORDS - left % new_world])
    else:  # every record of the epoch, the padding repeats the epoch's first positions
        assert set(before + after) == set(range(RECORDS))
