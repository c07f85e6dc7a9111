"""Hostile Hugging Face folders for the fuzz target: a ``save_to_disk`` folder whose
``state.json`` names files outside it, and links planted in it.

::

    corpus/hf/           state.json  dataset_info.json  data-00000-of-00001.arrow (labels 0-2)
    corpus/hf-private/   data.arrow  (labels 100-107): the user's, beside the folder, under a
                         name that starts like it

:func:`mutate_state` rewrites ``state.json``: its data files (``../hf-private/data.arrow``,
absolute paths, URLs, ``..``, the folder's own JSON files, devices, values that are no
names), its saved format (a library name: never imported), or adds ``_fuzz_links``, links
:func:`run` plants in the folder before packing (to the sibling, to a device, to a folder, to
themselves, to files inside). ``@ROOT@`` stands for the workspace, so that inputs stay a
function of seed and number. The folder is packed; only a ShardfeedError may escape, and a
pack that succeeds must hold none of the user's records (labels 100-107). Without the
``datasets`` library (the ``hf`` extra) the target is left out (:data:`AVAILABLE`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

AVAILABLE = importlib.util.find_spec("datasets") is not None
"""Whether the target runs (``datasets`` installed)."""
FOLDER = "hf"
OUTSIDE = "hf-private"
FOLDERS = (FOLDER, OUTSIDE) if AVAILABLE else ()
"""The corpus folders of the target."""
DATA = "data-00000-of-00001.arrow"
ROOT = "@ROOT@"
OUTSIDE_LABELS = frozenset(range(100, 108))

NAMES: tuple[Any, ...] = (
    DATA, f"sub/../{DATA}", f"{ROOT}/{FOLDER}/{DATA}", "link.arrow",
    f"../{OUTSIDE}/data.arrow", f"{ROOT}/{OUTSIDE}/data.arrow", f"../{FOLDER}/../{OUTSIDE}/data.arrow",
    f"file://{ROOT}/{OUTSIDE}/data.arrow", "http://127.0.0.1:9/x.arrow", "s3://b/x.arrow",
    "..", ".", "", "/", "/dev/zero", "/etc/hostname", "state.json", "dataset_info.json",
    "a\x00b", "missing.arrow", 7, None, ["x"], {"filename": DATA},
)
LINK_NAMES = (DATA, "link.arrow", "dataset_info.json", "state.json")
LINK_TARGETS = (
    f"../{OUTSIDE}/data.arrow", f"{ROOT}/{OUTSIDE}/data.arrow", f"../{OUTSIDE}", "/dev/zero",
    DATA, "link.arrow", "dataset_info.json", ".", "missing",
)
FORMATS: tuple[Any, ...] = ("numpy", "torch", "tensorflow", "jax", "pandas", "arrow",
                            "custom", "polars", 3, None)


def build(root: Path) -> None:
    """Write ``root/hf`` and ``root/hf-private`` (both created; nothing without
    ``datasets``)."""
    if not AVAILABLE:
        return
    import cv2
    import datasets
    import numpy as np

    def saved(folder: Path, labels: list[int]) -> None:
        features = datasets.Features({"image": datasets.Image(),
                                      "label": datasets.Value("int64")})
        pngs = [cv2.imencode(".png", np.full((4, 5, 3), i, np.uint8))[1].tobytes()
                for i in labels]
        datasets.Dataset.from_dict(
            {"image": [{"bytes": p, "path": None} for p in pngs], "label": labels},
            features=features).save_to_disk(str(folder))

    saved(root / FOLDER, [0, 1, 2])
    saved(root / "hf-made", sorted(OUTSIDE_LABELS))
    (root / OUTSIDE).mkdir()
    os.rename(root / "hf-made" / DATA, root / OUTSIDE / "data.arrow")
    shutil.rmtree(root / "hf-made")


def mutate_state(rng: random.Random, data: bytes) -> bytes:
    """``state.json`` with its data files, its format or its planted links rewritten."""
    try:
        state = json.loads(data)
    except (ValueError, RecursionError):
        return data
    if not isinstance(state, dict):
        return data
    roll = rng.random()
    if roll < 0.5:
        state["_data_files"] = [{"filename": rng.choice(NAMES)}
                                for _ in range(rng.choice((1, 1, 2, 3)))]
    elif roll < 0.6:
        state["_data_files"] = rng.choice(({}, [], "x", [DATA], [{"file": DATA}], None))
    elif roll < 0.7:
        state["_format_type"] = rng.choice(FORMATS)
        state["_format_kwargs"] = rng.choice(({}, {"dtype": "float64"}, [], None))
    else:
        links = state.setdefault("_fuzz_links", {})
        if isinstance(links, dict):
            links[rng.choice(LINK_NAMES)] = rng.choice(LINK_TARGETS)
    return json.dumps(state).encode()


def run(data: bytes, workspace: Path) -> Path | None:
    """Write ``state.json``, plant its ``_fuzz_links`` and pack the folder; the packed folder,
    or None when pack refused it (a ShardfeedError: allowed)."""
    import shardfeed
    from shardfeed.errors import ShardfeedError

    folder = workspace / FOLDER
    data = data.replace(ROOT.encode(), os.fsencode(workspace))
    (folder / "state.json").write_bytes(data)
    for name, target in _links(data):
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.symlink_to(target.replace(ROOT, os.fspath(workspace)))
    out = workspace / "hf-out"
    shutil.rmtree(out, ignore_errors=True)
    try:
        shardfeed.pack(folder, out, records_per_shard=2)
    except ShardfeedError:
        return None
    with shardfeed.Dataset(out) as ds:
        labels = {int(r["label"][0]) for r in ds.read_many(range(len(ds)))
                  if "label" in r}
    leaked = sorted(labels & OUTSIDE_LABELS)
    if leaked:
        raise AssertionError(f"pack read the user's records outside the folder: {leaked}")
    return out


def _links(data: bytes) -> list[tuple[str, str]]:
    """The links ``state.json`` asks for (plain names in the folder, text targets)."""
    try:
        state = json.loads(data)
    except (ValueError, RecursionError):
        return []
    links = state.get("_fuzz_links") if isinstance(state, dict) else None
    if not isinstance(links, dict):
        return []
    return [(n, t) for n, t in links.items()
            if n in LINK_NAMES and isinstance(t, str) and "\x00" not in t]
