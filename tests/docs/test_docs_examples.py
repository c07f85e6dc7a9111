"""Every example of the user documentation runs as written, in the folder its reader makes.

- Each page (README.md and docs/*.md, not docs/architecture.md, which sketches internal
  contracts) says once, before its first example, how to make the files its examples use:
  ``shardfeed examples DIR && cd DIR``. The page then runs in a private copy of a folder made
  by that very command (``conftest.py``), in document order, as a reader would: every
  ```python block in one shared namespace, and every ``shardfeed ...`` line of a shell block
  through ``shardfeed.cli.main.main`` (shell globs expanded as the shell would). A command
  exits 0 unless its comment starts with ``exit N`` (``shardfeed verify damaged/  # exit 1:
  ...``). A python block whose first line is ``# doc: no-run (reason)`` is skipped; the
  reason is required (object storage credentials, several GPUs, ...). Shell lines with
  placeholders (``...``, ``<x>``, ``{x}``) and ``--help`` are not run.
- Every ``shardfeed ...`` line is also parsed with the real argument parser; inline
  `shardfeed ...` spans and lines with placeholders are checked for their command and flag
  names only.
- Links between the pages point at files that exist, and the README links every guide.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
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
# The line that makes a page's example files, and the exit status a command's comment names.
SETUP = re.compile(r"shardfeed examples (?P<dir>[\w./-]+) && cd (?P=dir)(?=[\s`]|$)")
EXPECTED_EXIT = re.compile(r"(?:^|\s)#\s*exit\s+(?P<code>\d+)\b")


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


PYTHON_LANGS = {"python", "py", "python3"}


def _no_run(block: Block) -> bool:
    first = block.text.splitlines()[0].strip() if block.text.strip() else ""
    skip = NO_RUN.match(first)
    if skip:
        assert skip.group("reason").strip(), (
            f"{block.where}: '# doc: no-run' needs a reason on the same line, e.g. "
            "'# doc: no-run (needs S3 credentials)'"
        )
        compile(block.text, block.where, "exec")  # it must still be valid Python
    return skip is not None


# --- command lines ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandLine:
    where: str
    line: int  # 1-based line in its page
    text: str
    full: bool  # parse completely (a fenced line) or check names only (inline span)

    @property
    def command(self) -> str:
        """The shardfeed command alone, without its comment: ``a && cd b  # c`` keeps ``a``."""
        return re.sub(r"(^|\s)#.*$", "", self.text).split("&&", 1)[0].strip()

    @property
    def placeholder(self) -> bool:
        return PLACEHOLDER.search(self.command) is not None

    @property
    def runs(self) -> bool:
        """A fenced line without placeholders, help or the page's set-up runs for real."""
        tokens = shlex.split(self.command)
        return (self.full and not self.placeholder and "--help" not in tokens
                and "-h" not in tokens and not SETUP.search(self.text))


def shell_lines(block: Block) -> list[CommandLine]:
    """The ``shardfeed ...`` lines of a shell block (backslash continuations joined)."""
    found: list[CommandLine] = []
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
            where = f"{block.path.relative_to(REPO)}:{number}"
            found.append(CommandLine(where, number, text, True))
    return found


def command_lines() -> list[CommandLine]:
    found: list[CommandLine] = []
    for page in user_pages():
        for block in fenced_blocks(page):
            if block.lang in SHELL_LANGS:
                found += shell_lines(block)
        text = prose(page)
        for m in re.finditer(r"`(shardfeed [^`]+)`", text):
            number = text.count("\n", 0, m.start()) + 1
            found.append(CommandLine(f"{page.relative_to(REPO)}:{number}", number, m.group(1),
                                     False))
    return found


COMMAND_LINES = command_lines()


def argv(line: CommandLine) -> list[str]:
    """The arguments the shell would pass: quotes removed, unquoted globs expanded here."""
    lexer = shlex.shlex(line.command, posix=False)  # keeps the quotes, to see what they guard
    lexer.whitespace_split = True
    words: list[str] = []
    for raw in lexer:
        quoted = any(q in raw for q in "'\"")
        matches = sorted(glob.glob(raw)) if not quoted and any(c in raw for c in "*?[") else []
        words += matches or shlex.split(raw)
    return words[1:]


def run_command(line: CommandLine) -> tuple[int, str]:
    """Run one command line in-process; its exit status and what it printed."""
    from shardfeed.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv(line))
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return code, out.getvalue()


# --- every page runs, in document order -------------------------------------------------------


def page_steps(page: Path) -> list[Block | CommandLine]:
    """The python blocks and shell command lines of a page, in the order a reader meets them."""
    steps: list[Block | CommandLine] = []
    for block in fenced_blocks(page):
        if block.lang in PYTHON_LANGS:
            steps.append(block)
        elif block.lang in SHELL_LANGS:
            steps += shell_lines(block)
    return steps


def runnable(step: Block | CommandLine) -> bool:
    return step.runs if isinstance(step, CommandLine) else not _no_run(step)


PAGES_WITH_EXAMPLES = [p for p in user_pages() if any(runnable(s) for s in page_steps(p))]


def test_there_are_examples_to_run() -> None:
    steps = [s for p in PAGES_WITH_EXAMPLES for s in page_steps(p) if runnable(s)]
    assert sum(isinstance(s, Block) for s in steps) >= 20, "the guides should show their examples"
    assert sum(isinstance(s, CommandLine) for s in steps) >= 25, "and run their command lines"


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_page_says_how_to_make_its_files(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    setups = list(SETUP.finditer(text))
    assert len(setups) == 1, (
        f"{page.name}: say once, before the first example, how to make its files: "
        f"`shardfeed examples ex/ && cd ex/` (found {len(setups)})"
    )
    line = text.count("\n", 0, setups[0].start()) + 1
    first = min(s.line for s in page_steps(page) if runnable(s))
    assert line <= first, f"{page.name}:{line}: the set-up line comes after the example at {first}"


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_page_examples_run(page: Path, workspace: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        for step in page_steps(page):
            if not runnable(step):
                continue
            if isinstance(step, CommandLine):
                code, output = run_command(step)
                wanted = EXPECTED_EXIT.search(step.text)
                expected = int(wanted.group("code")) if wanted else 0
                if code != expected:
                    pytest.fail(f"{step.where}: `{step.text}` exited {code}, the page says "
                                f"{expected}:\n{output}", pytrace=False)
                continue
            code_object = compile(step.text, step.where, "exec")
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    exec(code_object, namespace)  # noqa: S102 - running the docs is the point
            except Exception:  # noqa: BLE001 - any failure of an example is reported
                pytest.fail(
                    f"the example at {step.where} failed:\n{step.text}\n"
                    f"{traceback.format_exc()}\noutput so far:\n{out.getvalue()}",
                    pytrace=False,
                )
    finally:
        for value in list(namespace.values()):
            close = getattr(value, "close", None)
            if callable(close) and type(value).__module__.startswith("shardfeed"):
                with contextlib.suppress(Exception):
                    close()
        namespace.clear()
        gc.collect()


# --- every command line parses ----------------------------------------------------------------


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    from shardfeed.cli.main import build_parser

    parser = build_parser()
    commands: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands.update(action.choices)
    return parser, commands


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
    tokens = shlex.split(line.command)
    _check_names(line, tokens)
    if not line.full or line.placeholder or "--help" in tokens or "-h" in tokens:
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
