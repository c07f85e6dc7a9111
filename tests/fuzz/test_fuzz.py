"""The fuzz target: mutated shards, Examples, indexes of both formats, manifests, sidecars,
pack inputs (WebDataset tars, .npz archives, Parquet files, Hugging Face folders whose
state.json names files outside them) and disk-cache entries, run
through the public API in a worker process bounded in time and memory.
Only a ShardfeedError may escape; anything else is a finding (see ``fuzz_run.py``).

The suite runs 2,500 inputs; ``pytest tests/fuzz --fuzz-inputs 200000`` or
``python tests/fuzz/fuzz_run.py --inputs 200000`` runs a long pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import fuzz_corpus
import fuzz_run
import fuzz_targets
import pytest


def test_only_shardfeed_errors_escape(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    seed = int(request.config.getoption("--fuzz-seed"))
    inputs = request.config.getoption("--fuzz-inputs") or fuzz_run.DEFAULT_INPUTS
    report = fuzz_run.run(inputs, seed=seed, work=tmp_path)
    shown = "\n".join(json.dumps(f) for f in report.findings[:10])
    assert not report.findings, (
        f"{report.summary()}\n{shown}\nreplay one with: python tests/fuzz/fuzz_run.py "
        f"--seed {seed} --replay N"
    )


def test_inputs_are_a_function_of_seed_and_number(tmp_path: Path) -> None:
    corpus = fuzz_corpus.build(tmp_path / "corpus")
    first = fuzz_targets.Workspace(corpus, tmp_path / "a")
    second = fuzz_targets.Workspace(corpus, tmp_path / "b")
    made = [fuzz_targets.make_input(7, n, first) for n in range(200)]
    assert made == [fuzz_targets.make_input(7, n, second) for n in range(200)]
    assert len({inp.target.name for inp in made}) == len(fuzz_targets.TARGETS)
    changed = [inp.data != first.seed(inp.target) for inp in made
               if inp.target.family != "example"]
    assert sum(changed) > 0.9 * len(changed)
