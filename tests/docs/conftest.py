"""Fixtures of the documentation tests: the example files every example of the docs works on.

They are made exactly as a reader makes them, with ``shardfeed examples DIR`` (see
``shardfeed.tools.demo.examples`` for what it writes: photos/, masks/, labels.csv, frames/,
frames.csv, large/, out/, days/, big/, existing/, old/, damaged/), once a session; each page
then runs in a private copy of them.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest


def build_workspace(root: Path) -> None:
    """Run ``shardfeed examples ROOT``, the command every page tells its reader to run."""
    from shardfeed.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["examples", str(root)])
    assert code == 0, f"shardfeed examples {root} exited {code}: {err.getvalue()}"


@pytest.fixture(scope="session")
def docs_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example files, made once; copy before use (examples write into it)."""
    root = tmp_path_factory.mktemp("docs-workspace") / "ex"
    build_workspace(root)
    return root


@pytest.fixture()
def workspace(docs_workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the example files, made the current directory."""
    here = tmp_path / "work"
    shutil.copytree(docs_workspace, here)
    monkeypatch.chdir(here)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return Path(os.getcwd())
