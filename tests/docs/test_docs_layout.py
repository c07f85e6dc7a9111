"""The layout the docs show is the code's: README.md's "Layout" and docs/architecture.md's
"Module map" name every package and module that exists, and nothing that does not.

Both are a fenced block under their heading, one entry a line: the entry's name (a folder
ends in ``/``), then its description after two spaces or more. Two spaces of indentation a
level put an entry inside the folder above it; an entry without indentation is a path from
the repository root (``src/shardfeed/``, ``tests/``).

The rules (what a failure asks for):

- Every entry exists (a file or a folder). A renamed or removed module fails here: remove
  or rename its line.
- docs/architecture.md lists every package (a folder with ``__init__.py``) and every module
  under ``src/shardfeed/``, private ``_*.py`` and ``__main__.py`` included, each under its
  own folder; ``__init__.py`` is not required (a package's line says what it holds, and
  where a package's ``__init__.py`` holds its entry point, the line says so). A new module
  fails here until its line is added; the message gives the line to add and where.
- README.md lists every package and module directly under ``src/shardfeed/`` (not
  ``__init__.py``); the module map lists the rest.
- Every entry has a description, and the layers appear in their order, lowest first
  (storage, format, dataset, sampling, transforms, pipeline, loaders, tools, cli: the order
  of docs/architecture.md and tests/test_layers.py).
- Other files are listed only where the docs choose to (a data folder such as
  ``tools/demo/example_files/``); they must exist all the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "shardfeed"
README = REPO / "README.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
LAYERS = ["storage", "format", "dataset", "sampling", "transforms", "pipeline", "loaders",
          "tools", "cli"]
INDENT = 2
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?: {2,}(?P<what>\S.*))?$")


@dataclass(frozen=True, slots=True)
class Entry:
    path: str  # from the repository root; a folder ends in "/"
    what: str
    where: str  # "docs/architecture.md:123"


def section_tree(page: Path, heading: str, *, repo: Path = REPO) -> list[Entry]:
    """The entries of the first fenced block under ``heading`` in ``page``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    name = page.relative_to(repo).as_posix()
    starts = [i for i, line in enumerate(lines) if line.strip() == heading]
    assert len(starts) == 1, f"{name}: expected one '{heading}' section, found {len(starts)}"
    i = starts[0] + 1
    while i < len(lines) and not lines[i].startswith("```"):
        assert not lines[i].startswith("#"), f"{name}: '{heading}' has no fenced block"
        i += 1
    assert i < len(lines), f"{name}: '{heading}' has no fenced block"
    entries: list[Entry] = []
    folders: list[str] = []  # the folder of each level above the current line
    for number in range(i + 1, len(lines)):
        line = lines[number]
        if line.startswith("```"):
            return entries
        if not line.strip():
            continue
        where = f"{name}:{number + 1}"
        m = ENTRY.match(line)
        assert m, f"{where}: expected `name  what it is for`, got {line!r}"
        depth, rest = divmod(len(m.group("indent")), INDENT)
        assert rest == 0 and depth <= len(folders), (
            f"{where}: indent {len(m.group('indent'))} spaces; use {INDENT} a level, one level "
            "inside the folder above"
        )
        folders = folders[:depth]
        path = "".join(folders) + m.group("name")
        entries.append(Entry(path, m.group("what") or "", where))
        if path.endswith("/"):
            folders.append(m.group("name"))
    raise AssertionError(f"{name}: the fenced block under '{heading}' is never closed")


def exists(path: str, *, repo: Path = REPO) -> bool:
    target = repo / path
    return target.is_dir() if path.endswith("/") else target.is_file()


def modules(*, top_only: bool, repo: Path = REPO) -> list[str]:
    """Every package (``pkg/``) and module under src/shardfeed/ that the docs must list,
    as paths from the repository root."""
    package = repo / "src" / "shardfeed"
    found: list[str] = []
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if "__pycache__" in path.parts or (top_only and path.parent != package):
            continue
        if path.is_dir() and (path / "__init__.py").is_file():
            found.append(rel + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.append(rel)
    return found


def placement(path: str) -> str:
    """Where a missing entry goes, and its line: ``inside `pipeline/`: `    x.py  ...` ``."""
    inside = path.removeprefix("src/shardfeed/").rstrip("/")
    parent, _, leaf = inside.rpartition("/")
    leaf += "/" if path.endswith("/") else ""
    depth = parent.count("/") + 2 if parent else 1
    folder = f"`{parent}/`" if parent else "`src/shardfeed/`"
    return f"inside {folder}: `{' ' * INDENT * depth}{leaf}  <what it is for>`"


def check_tree(page: Path, heading: str, *, top_only: bool, repo: Path = REPO) -> list[str]:
    """Every problem of one tree, each with its one-line fix."""
    entries = section_tree(page, heading, repo=repo)
    name = page.relative_to(repo).as_posix()
    problems: list[str] = []
    seen: set[str] = set()
    for entry in entries:
        if not exists(entry.path, repo=repo):
            kind = "folder" if entry.path.endswith("/") else "file"
            problems.append(f"{entry.where}: remove the line for `{entry.path}` (no such {kind})")
        if entry.path in seen:
            problems.append(f"{entry.where}: `{entry.path}` is listed twice; remove one")
        if not entry.what:
            problems.append(f"{entry.where}: say what `{entry.path}` is for, after two spaces")
        seen.add(entry.path)
    for path in modules(top_only=top_only, repo=repo):
        if path not in seen:
            problems.append(f"{name}, '{heading}': add a line for `{path}` {placement(path)}")
    layers = [e.path.removeprefix("src/shardfeed/").rstrip("/") for e in entries
              if e.path.startswith("src/shardfeed/") and e.path.count("/") == 3
              and e.path.endswith("/")]
    ordered = [layer for layer in layers if layer in LAYERS]
    if ordered != sorted(ordered, key=LAYERS.index):
        problems.append(f"{name}, '{heading}': list the layers lowest first, {LAYERS} "
                        f"(found {ordered})")
    return problems


def test_the_layer_list_is_the_packages() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(LAYERS)


def test_architecture_module_map_is_the_tree() -> None:
    problems = check_tree(ARCHITECTURE, "## Module map", top_only=False)
    assert not problems, "docs/architecture.md's module map differs from src/shardfeed/:\n" + (
        "\n".join(problems))


def test_readme_layout_is_the_tree() -> None:
    problems = check_tree(README, "## Layout", top_only=True)
    assert not problems, "README.md's layout differs from src/shardfeed/:\n" + (
        "\n".join(problems))


def test_a_missing_or_stale_line_is_named_with_its_fix(tmp_path: Path) -> None:
    """What a merge meets: a new module without a line, a line whose module is gone, a
    line without its description, layers out of order; each message says the fix."""
    package = tmp_path / "src" / "shardfeed"
    for folder in ("storage", "pipeline", "tools/pack"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("", encoding="utf-8")
    for module in ("__init__.py", "errors.py", "storage/base.py", "pipeline/loader.py",
                   "pipeline/batch_stage.py", "tools/pack/plan.py"):
        (package / module).write_text("", encoding="utf-8")
    page = tmp_path / "map.md"
    page.write_text(
        "## Module map\n\n```\n"
        "src/shardfeed/  the package\n"
        "  errors.py  the exception hierarchy\n"
        "  pipeline/  the Loader\n"
        "    loader.py  the Loader\n"
        "    gone.py  split out, then merged back\n"
        "  storage/  bytes\n"
        "    base.py\n"
        "  tools/  the tools\n"
        "```\n", encoding="utf-8")
    problems = check_tree(page, "## Module map", top_only=False, repo=tmp_path)
    assert problems == [
        "map.md:8: remove the line for `src/shardfeed/pipeline/gone.py` (no such file)",
        "map.md:10: say what `src/shardfeed/storage/base.py` is for, after two spaces",
        ("map.md, '## Module map': add a line for `src/shardfeed/pipeline/batch_stage.py` "
         "inside `pipeline/`: `    batch_stage.py  <what it is for>`"),
        ("map.md, '## Module map': add a line for `src/shardfeed/tools/pack/` "
         "inside `tools/`: `    pack/  <what it is for>`"),
        ("map.md, '## Module map': add a line for `src/shardfeed/tools/pack/plan.py` "
         "inside `tools/pack/`: `      plan.py  <what it is for>`"),
        (f"map.md, '## Module map': list the layers lowest first, {LAYERS} "
         "(found ['pipeline', 'storage', 'tools'])"),
    ]
