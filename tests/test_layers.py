"""The layers of docs/architecture.md: every module imports only its own layer and those below
it, and torch / jax / tensorflow / keras are imported only by their adapters."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shardfeed"

# bottom to top; errors.py may be imported by every layer
LAYERS = ["storage", "format", "dataset", "sampling", "transforms", "pipeline", "loaders",
          "tools", "cli"]
ADAPTERS = {"loaders/torch.py": "torch", "loaders/torch_decode.py": "torch",
            "loaders/device_resize.py": "torch",
            "loaders/jax.py": "jax", "loaders/tensorflow.py": "tensorflow",
            "loaders/tf_stream.py": "tensorflow",
            "loaders/keras.py": "keras"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append((node.module, node.lineno))
    return names


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "shardfeed" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_downward(path: Path) -> None:
    rel = path.relative_to(PACKAGE)
    own = rel.parts[0] if rel.parts[0] in LAYERS else None
    for module, line in _imports(path):
        target = _layer(module)
        if own is not None and target is not None:
            assert LAYERS.index(target) <= LAYERS.index(own), (
                f"{rel}:{line} imports {module}: layer {own!r} must not import {target!r}"
            )
        root = module.split(".")[0]
        if root in ("torch", "jax", "jaxlib", "tensorflow", "keras"):
            assert ADAPTERS.get(rel.as_posix()) == root, (
                f"{rel}:{line} imports {module}: only {sorted(ADAPTERS)} may import a framework"
            )


def test_layer_list_names_every_package() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages == set(LAYERS)


def _module_name(path: Path) -> str:
    parts = ("shardfeed", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other() -> None:
    """A module pair that imports each other (at run time, inside a function, or for types
    only) is one module split in two: what both need goes in a third, lower one, or the
    lower one names what it needs as a Protocol. A package's ``__init__`` re-exporting its
    own modules is not such a pair."""
    modules = {_module_name(p): p for p in _modules()}
    imports: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        imports[name] = found & set(modules)
    pairs = sorted((a, b) for a in imports for b in imports[a]
                   if a < b and a in imports.get(b, ())
                   and not b.startswith(a + ".") and not a.startswith(b + "."))
    assert not pairs, f"modules that import each other: {pairs}"
