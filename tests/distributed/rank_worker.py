"""One rank of a data-parallel job under torch.distributed (gloo), started by the tests.

Phases, all in this one process (starting processes that import torch is the slow part):

1. world size 4 (RANK/WORLD_SIZE/MASTER_* from the environment, ``init_method="env://"``):
   a whole epoch with ``remainder="drop"`` and one with ``"pad"``; then, per remainder, a
   few steps and the state (checked equal on all ranks with ``gather_states``).
2. the job "restarts" on fewer ranks: the group is destroyed and ranks < W' form a new one
   (W' = 2, then 3) on another port; each restores the saved state and reads the rest. Rank 0
   holds those ports bound from phase 1 on (sent to the others over the first group) and lets
   each go just before its group forms: a port chosen free and let go at once could be taken
   as the local port of one of phase 1's many connections, and the next group would hang.

Every Loader is built without rank/world_size: the ranks come from the process group.
Results go to ``<out>/phase<W>-rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from shardfeed import Dataset, Loader
from shardfeed.loaders.distributed import detect_ranks, gather_states

BATCH = 2
SEED = 5
STEPS_BEFORE = 2


def ids_of(loader: Loader) -> list[int]:
    return [int(i) for batch in loader for i in batch["index"].tolist()]


def make_loader(ds: Dataset, remainder: str) -> Loader:
    return Loader(ds, batch_size=BATCH, shuffle=True, seed=SEED, transform=None,
                  num_threads=1, prefetch_batches=1, remainder=remainder)


def first_phase(ds: Dataset, out: Path) -> None:
    info = detect_ranks()
    result: dict[str, Any] = {"rank": info.rank, "world_size": info.world_size,
                              "source": info.source}
    for remainder in ("drop", "pad"):
        with make_loader(ds, remainder) as loader:
            result[f"ranks_{remainder}"] = [loader.options.rank, loader.options.world_size]
            result[f"epoch_{remainder}"] = ids_of(loader)
            result[f"after_epoch_{remainder}"] = loader.state()
        with make_loader(ds, remainder) as loader:
            it = iter(loader)
            seen = [int(i) for _ in range(STEPS_BEFORE) for i in next(it)["index"].tolist()]
            result[f"before_{remainder}"] = seen
            result[f"state_{remainder}"] = gather_states(loader.state())
    (out / f"phase{info.world_size}-rank{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()


def resumed_phase(ds: Dataset, out: Path, states: dict[str, Any]) -> None:
    info = detect_ranks()
    result: dict[str, Any] = {"rank": info.rank, "world_size": info.world_size,
                              "source": info.source}
    for remainder in ("drop", "pad"):
        with make_loader(ds, remainder) as loader:
            loader.restore(states[remainder])
            loader.set_epoch(0)  # what a resumed training loop calls: keeps the position
            result[f"after_{remainder}"] = ids_of(loader)
    (out / f"phase{info.world_size}-rank{info.rank}.json").write_text(json.dumps(result))
    dist.barrier()


def _held_ports(rank: int) -> tuple[list[int], list[socket.socket]]:
    """The later groups' ports: bound by rank 0 (and kept bound), sent to every rank."""
    held: list[socket.socket] = []
    if rank == 0:
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
    ports: list[Any] = [sock.getsockname()[1] for sock in held] or [None, None]
    dist.broadcast_object_list(ports, src=0)
    return [int(port) for port in ports], held


def main() -> None:
    folder, out_dir = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    ds = Dataset(folder)
    dist.init_process_group("gloo", init_method="env://")
    first_phase(ds, out_dir)
    ports, held = _held_ports(rank)
    states = {r: json.loads(json.dumps(_saved(out_dir, r))) for r in ("drop", "pad")}
    dist.destroy_process_group()
    for k, (new_size, port) in enumerate(zip((2, 3), ports)):
        if rank < new_size:
            if held:
                held[k].close()  # rank 0 listens on it next
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=rank, world_size=new_size)
            resumed_phase(ds, out_dir, states)
            dist.destroy_process_group()
    ds.close()


def _saved(out_dir: Path, remainder: str) -> Any:
    # rank 0's state is the checkpoint (every rank's is the same; gather_states checked it)
    data = json.loads((out_dir / "phase4-rank0.json").read_text())
    return data[f"state_{remainder}"]


if __name__ == "__main__":
    main()
