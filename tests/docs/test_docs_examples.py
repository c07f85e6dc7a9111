"""Every example of the user documentation runs, and every command line it shows parses.

- The ```python blocks of README.md and docs/*.md (not docs/architecture.md, which sketches
  internal contracts) run in order, one shared namespace per file, in a private copy of the
  example files of ``conftest.py``. A block whose first line is ``# doc: no-run (reason)``
  is skipped; the reason is required (object storage credentials, several GPUs, ...).
- Every ``shardfeed ...`` line of a shell block is parsed with the real argument parser
  (``shardfeed.cli.main.build_parser``); lines with obvious placeholders (``...``, ``<x>``)
  are only checked for their command and flag names, as are inline `shardfeed ...` spans.
- Links between the pages point at files that exist, and the README links every guide.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import re
import shlex
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
INTERNAL = {"architecture.md"}  # internal contracts for people changing shardfeed, not user examples

NO_RUN = re.compile(r"^#\s*doc:\s*no-run\b[\s:(\-—]*(?P<reason>.*)$")
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|\{[^}]*\}")
SHELL_LANGS = {"sh", "bash", "shell", "console", "text", ""}


@dataclass(frozen=True, slots=True)
class Block:
    path: Path
    line: int  # 1-based line of the first line inside the fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def user_pages() -> list[Path]:
    pages = [README] + sorted(p for p in DOCS.glob("*.md") if p.name not in INTERNAL)
    return [p for p in pages if p.exists()]


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with their language and first line."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.name}:{i + 1}: code fence is never closed")
        indent = len(m.group(1))
        body = [ln[indent:] if ln[:indent].isspace() else ln for ln in lines[start:j]]
        blocks.append(Block(path, start + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def prose(path: Path) -> str:
    """The file's text with fenced blocks blanked out (for inline spans and links)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, inside, fence = [], False, ""
    for line in lines:
        stripped = line.strip()
        if not inside and stripped.startswith(("```", "~~~")):
            inside, fence = True, stripped[:3]
            out.append("")
        elif inside and stripped.startswith(fence):
            inside = False
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out)


def python_blocks(path: Path) -> list[Block]:
    return [b for b in fenced_blocks(path) if b.lang in ("python", "py", "python3")]


# --- python examples ------------------------------------------------------------------------

PAGES_WITH_PYTHON = [p for p in user_pages() if python_blocks(p)]


def test_there_are_examples_to_run() -> None:
    runnable = [b for p in PAGES_WITH_PYTHON for b in python_blocks(p)
                if not NO_RUN.match(b.text.splitlines()[0].strip())]
    assert len(runnable) >= 20, "the guides should show (and this test run) their examples"


@pytest.mark.parametrize("page", PAGES_WITH_PYTHON, ids=lambda p: p.name)
def test_python_examples_run(page: Path, workspace: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    try:
        for block in python_blocks(page):
            first = block.text.splitlines()[0].strip() if block.text.strip() else ""
            skip = NO_RUN.match(first)
            if skip:
                assert skip.group("reason").strip(), (
                    f"{block.where}: '# doc: no-run' needs a reason on the same line, e.g. "
                    "'# doc: no-run (needs S3 credentials)'"
                )
                compile(block.text, block.where, "exec")  # it must still be valid Python
                continue
            code = compile(block.text, block.where, "exec")
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(code, namespace)  # noqa: S102 - running the docs is the point
            except Exception:  # noqa: BLE001 - any failure of an example is reported
                pytest.fail(
                    f"the example at {block.where} failed:\n{block.text}\n"
                    f"{traceback.format_exc()}\noutput so far:\n{out.getvalue()}",
                    pytrace=False,
                )
            ran += 1
    finally:
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if callable(close) and type(value).__module__.startswith("shardfeed"):
                with contextlib.suppress(Exception):
                    close()
        namespace.clear()
        gc.collect()
    assert ran or page.name == "README.md", f"{page.name}: every python block is no-run"


# --- command lines ----------------------------------------------------------------------------


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from shardfeed.cli.main import build_parser

    parser = build_parser()
    commands: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    return parser, commands


@dataclass(frozen=True, slots=True)
class CommandLine:
    where: str
    text: str
    full: bool  # parse completely (a fenced line) or check names only (inline span)


def command_lines() -> list[CommandLine]:
    found: list[CommandLine] = []
    for page in user_pages():
        for block in fenced_blocks(page):
            if block.lang not in SHELL_LANGS:
                continue
            lines = block.text.splitlines()
            k = 0
            while k < len(lines):
                line, number = lines[k], block.line + k
                while line.rstrip().endswith("\\") and k + 1 < len(lines):
                    k += 1
                    line = line.rstrip()[:-1] + " " + lines[k].strip()
                k += 1
                text = line.strip().removeprefix("$ ")
                if text.startswith("shardfeed "):
                    found.append(CommandLine(f"{page.relative_to(REPO)}:{number}", text, True))
        text = prose(page)
        for m in re.finditer(r"`(shardfeed [^`]+)`", text):
            number = text.count("\n", 0, m.start()) + 1
            found.append(CommandLine(f"{page.relative_to(REPO)}:{number}", m.group(1), False))
    return found


COMMAND_LINES = command_lines()


def _check_names(line: CommandLine, tokens: list[str]) -> None:
    parser, commands = _parser()
    rest = tokens[1:]
    while rest and rest[0].startswith("-"):
        assert rest[0] in parser._option_string_actions, f"{line.where}: unknown {rest[0]}"
        rest = rest[1:]
    assert rest, f"{line.where}: `{line.text}` names no command"
    command = rest[0]
    assert command in commands, (
        f"{line.where}: `{line.text}`: no command {command!r}; commands: {sorted(commands)}"
    )
    sub = commands[command]
    for token in rest[1:]:
        if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            flag = token.split("=", 1)[0]
            assert flag in sub._option_string_actions, (
                f"{line.where}: `{line.text}`: 'shardfeed {command}' has no option {flag}"
            )


def test_command_lines_are_found() -> None:
    assert sum(1 for c in COMMAND_LINES if c.full) >= 15


@pytest.mark.parametrize("line", COMMAND_LINES, ids=lambda c: c.where)
def test_command_line_is_real(line: CommandLine) -> None:
    tokens = shlex.split(line.text, comments=True)
    _check_names(line, tokens)
    if not line.full or PLACEHOLDER.search(line.text) or "--help" in tokens or "-h" in tokens:
        return
    parser, _ = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(tokens[1:])
    except SystemExit:
        pytest.fail(f"{line.where}: `{line.text}` does not parse: {err.getvalue().strip()}",
                    pytrace=False)


# --- the README and links ---------------------------------------------------------------------


def test_readme_starts_with_the_two_commands() -> None:
    head = README.read_text(encoding="utf-8").splitlines()[:10]
    assert any(line.startswith("make demo") for line in head), head
    assert any(line.startswith("make test") for line in head), head


def test_readme_links_every_guide() -> None:
    text = README.read_text(encoding="utf-8")
    guides = [p.name for p in DOCS.glob("*.md") if p.name not in INTERNAL]
    assert len(guides) >= 12
    missing = [g for g in guides if f"docs/{g}" not in text]
    assert not missing, f"README.md does not link {missing}"


@pytest.mark.parametrize("page", user_pages(), ids=lambda p: p.name)
def test_relative_links_exist(page: Path) -> None:
    text = prose(page)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1).split("#", 1)[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: link to missing '{target}'"
