"""The public API as a type checker and a user see it: every name of ``shardfeed.__all__``
resolves at run time, and mypy sees each as what it is (the class, the function, the module),
never ``Any``, although ``import shardfeed`` imports them lazily."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import shardfeed
import shardfeed.pipeline

SRC = Path(shardfeed.__file__).resolve().parents[1]

# a class reveals as its constructor and a function as its signature: both end in the type
EXPECTED = {
    "shardfeed.Loader": "shardfeed.pipeline.loader.Loader",
    "shardfeed.Dataset": "shardfeed.dataset.dataset.Dataset",
    "shardfeed.Windows": "shardfeed.pipeline.windows.Windows",
    "shardfeed.Patches": "shardfeed.pipeline.patches.Patches",
    "shardfeed.pipeline.Windows": "shardfeed.pipeline.windows.Windows",
    "shardfeed.pipeline.Patches": "shardfeed.pipeline.patches.Patches",
    "shardfeed.pack": "shardfeed.tools.pack.output.PackResult",
    "shardfeed.presets.train": "shardfeed.transforms.base.Compose",
    "shardfeed.TooManyErrorsError": "shardfeed.errors.TooManyErrorsError",
}
PUBLIC = [f"shardfeed.{n}" for n in shardfeed.__all__ if n != "__version__"]
# adapters whose framework is an optional extra: resolved at run time only where installed
OPTIONAL = {"torch": "torch", "jax": "jax", "tf": "tensorflow", "keras": "keras"}
# a user's typo in a fixed-choice option, and a correct call
CALLS = [
    'shardfeed.Loader(shardfeed.Dataset("out/"), batch_size=8, on_error="ignore")',
    (
        'shardfeed.Loader(shardfeed.Dataset("out/"), batch_size=8, workers="processes", '
        'remainder="drop", order_method="bijection")'
    ),
]


@pytest.fixture(scope="module")
def mypy_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """mypy --strict on a user's snippet: (revealed types in order, error lines)."""
    tmp = tmp_path_factory.mktemp("typed-api")
    lines = [f"reveal_type({name})" for name in [*EXPECTED, *PUBLIC]] + CALLS
    snippet = tmp / "user_code.py"
    snippet.write_text("import shardfeed\nimport shardfeed.pipeline\n\n" + "\n".join(lines) + "\n")
    # a fresh interpreter, whose module search finds this tree's src/ first (MYPYPATH)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports",
         "--follow-imports=silent", "--cache-dir", str(tmp / "cache"), str(snippet)],
        capture_output=True, text=True, cwd=tmp, env={"MYPYPATH": str(SRC)}, timeout=600,
        check=False,
    )
    revealed = re.findall(r'user_code\.py:\d+: note: Revealed type is "(.*)"', result.stdout)
    assert len(revealed) == len(EXPECTED) + len(PUBLIC), result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    return revealed, errors


def test_every_public_name_resolves_at_run_time() -> None:
    for name in shardfeed.__all__:
        if name in OPTIONAL and importlib.util.find_spec(OPTIONAL[name]) is None:
            continue
        assert getattr(shardfeed, name) is not None, name
    assert set(shardfeed.__all__) <= set(dir(shardfeed))
    assert shardfeed.Loader.__name__ == "Loader"
    assert isinstance(shardfeed.presets, types.ModuleType)
    assert callable(shardfeed.pack)
    for name in shardfeed.pipeline.__all__:
        assert getattr(shardfeed.pipeline, name) is not None, name


def test_type_checkers_see_the_public_classes_and_functions(
    mypy_output: tuple[list[str], list[str]],
) -> None:
    revealed, _ = mypy_output
    for (name, want), got in zip(EXPECTED.items(), revealed):
        assert got.endswith(f"-> {want}"), f"{name}: {got}"


def test_no_public_name_is_any_to_a_type_checker(
    mypy_output: tuple[list[str], list[str]],
) -> None:
    revealed, _ = mypy_output
    for name, got in zip(PUBLIC, revealed[len(EXPECTED):]):
        assert got != "Any", f"{name} is Any to a type checker"


def test_a_typo_in_a_fixed_choice_option_is_a_type_error(
    mypy_output: tuple[list[str], list[str]],
) -> None:
    _, errors = mypy_output
    first_call = 3 + len(EXPECTED) + len(PUBLIC) + 1  # its line in the snippet
    assert len(errors) == 1, "\n".join(errors)
    assert f"user_code.py:{first_call}:" in errors[0] and "on_error" in errors[0], errors[0]
