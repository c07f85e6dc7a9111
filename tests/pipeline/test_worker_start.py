"""Process workers that cannot start say why in one line, and leave nothing behind.

Each case runs a user's script in a fresh interpreter (``spawn`` re-runs the main script in
every worker, so only a real script shows what a user sees) and reads its stderr: before,
the docs' snippet without the ``__main__`` guard ended in a 208-line BrokenProcessPool
traceback, and a lambda transform in a PicklingError followed by BufferErrors and "leaked
shared_memory objects" warnings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from shardfeed.pipeline import Loader

SRC = Path(__file__).resolve().parents[2] / "src"
LEFTOVERS = ("BrokenProcessPool", "leaked", "Exception ignored", "BufferError",
             "PicklingError")

SNIPPET = """\
import threading
import shardfeed
ds = shardfeed.Dataset({folder!r})
procs = shardfeed.Loader(ds, batch_size=6, seed=3, transform={transform},
                         workers="processes", num_threads=2)
threads = shardfeed.Loader(ds, batch_size=6, seed=3, transform=shardfeed.presets.train(size=32))
try:
    assert all((a["image"] == b["image"]).all() for a, b in zip(procs, threads))
finally:
    procs.close()
    threads.close()
    print("threads left:", sorted(t.name for t in threading.enumerate()))
"""


def run_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def guarded(text: str) -> str:
    return 'if __name__ == "__main__":\n' + textwrap.indent(text, "    ")


def test_a_script_without_the_main_guard_gets_one_clear_line(
    tmp_path: Path, clean_folder: Path
) -> None:
    snippet = SNIPPET.format(folder=str(clean_folder),
                             transform="shardfeed.presets.train(size=32)")
    done = run_script(tmp_path, snippet)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("shardfeed.pipeline.workers.WorkerStartError: ")
    assert 'put the script\'s work under `if __name__ == "__main__":`' in last
    assert "train.py again" in last and "'spawn' method" in last
    assert done.stderr.count("Traceback") == 1  # the script's own, not one per worker
    assert len(done.stderr.splitlines()) < 30
    assert not any(word in done.stderr for word in LEFTOVERS), done.stderr
    assert "threads left: ['MainThread']" in done.stdout
    # the fix the line gives: the same snippet under the guard runs, and quietly
    fixed = run_script(tmp_path, guarded(snippet))
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stderr == ""
    assert "threads left: ['MainThread']" in fixed.stdout


def test_a_lambda_transform_is_refused_at_construction(tmp_path: Path,
                                                       clean_folder: Path) -> None:
    snippet = SNIPPET.format(folder=str(clean_folder), transform="lambda sample: sample")
    done = run_script(tmp_path, guarded(snippet))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("TypeError: workers='processes' sends the transform")
    assert "the function __main__.<lambda> cannot be pickled" in last
    assert "at the top level of a module" in last and "workers='threads'" in last
    assert not any(word in done.stderr.replace("(PicklingError:", "") for word in LEFTOVERS)
    assert "procs = shardfeed.Loader(" in done.stderr  # raised where the Loader is built


def test_a_transform_class_under_the_guard_is_named(tmp_path: Path, clean_folder: Path) -> None:
    """It pickles by name, but a worker re-running the script never defines it."""
    snippet = SNIPPET.format(folder=str(clean_folder), transform="Scale()")
    text = guarded("class Scale:\n    def __call__(self, sample, rng):\n        return sample\n"
                   + snippet)
    done = run_script(tmp_path, text)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("TypeError: a worker process could not load the transform")
    assert "Scale" in last and 'not inside `if __name__ == "__main__":`' in last
    assert not any(word in done.stderr for word in LEFTOVERS), done.stderr
    assert "threads left: ['MainThread']" in done.stdout


def nested_transform() -> Any:
    def flip(sample: dict[str, Any]) -> dict[str, Any]:
        return sample

    return flip


def test_a_nested_function_is_named_inside_a_compose(clean_ds: Any) -> None:
    from shardfeed.transforms import Compose, RandomHorizontalFlip

    transform = Compose([RandomHorizontalFlip(), nested_transform()])
    with pytest.raises(TypeError, match=r"the function .*nested_transform\.<locals>\.flip "
                                        r"cannot be pickled"):
        Loader(clean_ds, batch_size=4, transform=transform, workers="processes")
    Loader(clean_ds, batch_size=4, transform=transform, workers="threads").close()
