"""Every stage honours the same contract: state() at any batch, restore() anywhere, same stream.

A *case* is a name and a factory ``make(folder, num_threads) -> loader``. To put a new stage
(Windows, Patches, an adapter) under the contract, append a :class:`Case` to ``CASES``; each
test below then runs it through save/restore at several points:

    reference:  b0 b1 b2 b3 b4 b5 | b0' b1' b2' ...      (epoch e, then e+1)
    resumed:    b0 b1 b2 [state -> JSON -> new loader, other thread count] b3 b4 b5 | b0' ...
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import open_dataset, train_transform

from shardfeed.errors import StateError
from shardfeed.pipeline import Loader


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path, int], Any]
    shuffles: bool = True  # epochs differ


def _records(folder: Path, num_threads: int) -> Any:
    return Loader(open_dataset(folder), batch_size=6, seed=21, transform=train_transform(),
                  num_threads=num_threads, prefetch_batches=2, drop_last=False)


def _records_eval(folder: Path, num_threads: int) -> Any:
    return Loader.for_eval(open_dataset(folder), batch_size=8, num_threads=num_threads)


def _torch_adapter(folder: Path, num_threads: int) -> Any:
    torch_adapter = pytest.importorskip("shardfeed.loaders.torch")
    return torch_adapter.adapt(_records(folder, num_threads))


CASES = [
    Case("records-train", _records),
    Case("records-eval", _records_eval, shuffles=False),
    Case("records-torch", _torch_adapter),
]


def fingerprint(batch: dict[str, Any]) -> bytes:
    parts = []
    for key, value in batch.items():
        parts.append(key.encode())
        if hasattr(value, "numpy"):
            value = value.numpy()
        if isinstance(value, np.ndarray):
            parts.append(value.dtype.str.encode() + repr(value.shape).encode() + value.tobytes())
        else:
            parts.append(repr(value).encode())
    return b"|".join(parts)


def take(loader: Any, count: int | None) -> list[bytes]:
    """``count`` batches of the current epoch (all of them if None)."""
    out = []
    for batch in loader:
        out.append(fingerprint(batch))
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_restore_at_any_batch_continues_the_stream(case: Case, conformance_folder: Path) -> None:
    reference_loader = case.make(conformance_folder, 2)
    epoch0 = take(reference_loader, None)
    epoch1 = take(reference_loader, None)
    reference_loader.close()
    assert len(epoch0) >= 4 and (epoch0 != epoch1) is case.shuffles
    for stop in sorted({0, 1, len(epoch0) // 2, len(epoch0) - 1, len(epoch0)}):
        loader = case.make(conformance_folder, 2)
        head = take(loader, stop) if stop else []
        state = json.loads(json.dumps(loader.state()))
        loader.close()
        resumed = case.make(conformance_folder, 3 if stop % 2 else 1)
        resumed.restore(state)
        rest = take(resumed, None) if stop < len(epoch0) else []
        following = take(resumed, None)
        resumed.close()
        assert head + rest == epoch0, f"{case.name}: restored at batch {stop}"
        assert following == epoch1, f"{case.name}: next epoch after restoring at {stop}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_state_contract(case: Case, conformance_folder: Path) -> None:
    loader = case.make(conformance_folder, 1)
    state = loader.state()
    assert json.loads(json.dumps(state)) == state
    assert {"seed", "epoch", "consumed"} <= set(state)
    with pytest.raises(StateError):
        loader.restore({**state, "unexpected": 1})
    with pytest.raises(StateError):
        loader.restore({k: v for k, v in state.items() if k != "epoch"})
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(RuntimeError):
        iter(loader).__next__()


def test_restore_on_another_world_size(conformance_folder: Path) -> None:
    """Two ranks consume 3 steps; one rank resumes and reads exactly what is left."""
    ds = open_dataset(conformance_folder)
    seen: set[int] = set()
    states = []
    for rank in range(2):
        loader = Loader(ds, batch_size=4, seed=9, rank=rank, world_size=2, num_threads=2)
        it = iter(loader)
        for _ in range(3):
            seen.update(next(it)["index"].tolist())
        states.append(loader.state())
        loader.close()
    assert states[0] == states[1] and states[0]["consumed"] == 24
    single = Loader(ds, batch_size=5, seed=9, num_threads=2)
    single.restore(states[0])
    rest = [i for b in single for i in b["index"].tolist()]
    assert len(seen) == 24 and len(rest) == 57 - 24
    assert seen.isdisjoint(rest) and seen | set(rest) == set(range(57))
