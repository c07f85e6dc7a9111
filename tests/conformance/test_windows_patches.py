"""Windows and Patches under the shared stage contract (restore anywhere, same stream).

The cases reuse the generic checks of ``test_stage_state`` on a grouped frame dataset and a
photo dataset built here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from test_stage_state import Case
from test_stage_state import test_restore_at_any_batch_continues_the_stream as restore_contract
from test_stage_state import test_state_contract as state_contract

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from test_patches import write_photos
from test_windows import write_frames

from shardfeed.dataset import Dataset
from shardfeed.pipeline import Loader
from shardfeed.pipeline.patches import Patches
from shardfeed.pipeline.windows import Windows
from shardfeed.transforms import RandomHorizontalFlip, presets


def _windows(folder: Path, num_threads: int) -> Any:
    windows = Windows(Dataset(str(folder / "frames")), length=2, stride=1)
    return Loader(windows, batch_size=3, seed=5, num_threads=num_threads,
                  transform=presets.train(size=12))


def _windows_eval(folder: Path, num_threads: int) -> Any:
    windows = Windows(Dataset(str(folder / "frames")), length=3, stride=1)
    return Loader.for_eval(windows, batch_size=4, num_threads=num_threads,
                           transform=presets.eval(size=12))


def _patches(folder: Path, num_threads: int) -> Any:
    patches = Patches(Dataset(str(folder / "photos")), size=10, scale=(0.5, 1.5),
                      cache_images=3, refresh_every=4)
    return Loader(patches, batch_size=5, seed=7, num_threads=num_threads,
                  transform=RandomHorizontalFlip())


def _patches_nocache(folder: Path, num_threads: int) -> Any:
    patches = Patches(Dataset(str(folder / "photos")), size=10, cache_images=3,
                      refresh_every=4, cache=False)
    return Loader(patches, batch_size=5, seed=7, num_threads=num_threads)


def _patches_eval(folder: Path, num_threads: int) -> Any:
    patches = Patches(Dataset(str(folder / "photos")), size=10, cache_images=2,
                      refresh_every=5)
    return Loader.for_eval(patches, batch_size=6, num_threads=num_threads)


CASES = [
    Case("windows-train", _windows),
    Case("windows-eval", _windows_eval, shuffles=False),
    Case("patches-train", _patches),
    Case("patches-nocache", _patches_nocache),
    # images in stored order; picks and crops stay keyed by (seed, epoch), so epochs differ
    Case("patches-eval", _patches_eval),
]


@pytest.fixture(scope="module")
def sources_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("windows-patches")
    write_frames(root / "frames")
    write_photos(root / "photos", 8)
    return root


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_windows_patches_restore_anywhere(case: Case, sources_folder: Path) -> None:
    restore_contract(case, sources_folder)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_windows_patches_state_contract(case: Case, sources_folder: Path) -> None:
    state_contract(case, sources_folder)


def test_patch_state_restores_on_another_world_size(sources_folder: Path) -> None:
    """Two ranks take 2 steps each; one rank resumes and gets exactly the rest of the epoch."""
    ds = Dataset(str(sources_folder / "photos"))

    def make(**options: Any) -> Loader:
        patches = Patches(ds, size=6, cache_images=3, refresh_every=4)
        return Loader(patches, seed=3, num_threads=2, **options)

    full = [int(p) for b in make(batch_size=4) for p in b["patch/box"].sum(axis=1)]
    seen = []
    states = []
    for rank in range(2):
        loader = make(batch_size=3, rank=rank, world_size=2)
        it = iter(loader)
        for _ in range(2):
            seen.append(next(it)["patch/box"].sum(axis=1).tolist())
        states.append(loader.state())
        loader.close()
    assert states[0] == states[1] and states[0]["consumed"] == 12
    single = make(batch_size=5)
    single.restore(states[0])
    rest = [int(p) for b in single for p in b["patch/box"].sum(axis=1)]
    head = [x for pair in zip(*[seen[0] + seen[1], seen[2] + seen[3]]) for x in pair]
    assert head + rest == full
