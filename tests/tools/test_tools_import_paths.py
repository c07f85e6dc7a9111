"""The import paths the guides have shown keep working after tools/ became subpackages."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(("module", "name", "home"), [
    ("shardfeed.tools.pack", "pack", "shardfeed.tools.pack"),
    ("shardfeed.tools.csvinput", "CsvColumns", "shardfeed.tools.pack.csvinput"),
    ("shardfeed.tools.packcheck", "BadInputsError", "shardfeed.tools.pack.check"),
    ("shardfeed.tools.verify", "verify", "shardfeed.tools.verify"),
    ("shardfeed.tools.shuffle_report", "shuffle_report", "shardfeed.tools.shuffle_report"),
    ("shardfeed.tools.bench", "bench", "shardfeed.tools.bench"),
    ("shardfeed.tools.demo", "demo", "shardfeed.tools.demo"),
    ("shardfeed.tools.index", "index_files", "shardfeed.tools.index"),
    ("shardfeed.tools.inspect", "inspect", "shardfeed.tools.inspect"),
])
def test_documented_import_path_gives_the_same_object(module: str, name: str, home: str) -> None:
    shown = getattr(importlib.import_module(module), name)
    assert shown is getattr(importlib.import_module(home), name)
