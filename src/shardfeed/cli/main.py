"""The ``shardfeed`` command line.

Each command is one module in this package that defines ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are found here at start-up, and their
heavy imports happen inside ``run``. Exit codes: 0 ok, 1 the data or the check failed, 2 usage.
A command whose reader closed stdout (``shardfeed inspect out/ | head``) stops quietly with
141, what a shell reports for a command its pipe stopped (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

# The order commands are listed in by --help; a command module not named here comes last.
_ORDER = ("pack", "index", "inspect", "verify", "shuffle-report", "bench", "demo")


def _commands() -> list[ModuleType]:
    import shardfeed.cli as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_") or info.name in ("main", "common"):
            continue
        module = importlib.import_module(f"shardfeed.cli.{info.name}")
        if hasattr(module, "NAME") and hasattr(module, "run"):
            found.append(module)
    rank = {name: i for i, name in enumerate(_ORDER)}
    return sorted(found, key=lambda m: (rank.get(m.NAME, len(_ORDER)), m.NAME))


def _version() -> str:
    """The installed distribution's version; the package's own when it runs uninstalled."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardfeed")
    except PackageNotFoundError:
        from shardfeed import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardfeed",
        description=(
            "Pack images into indexed TFRecord shards and feed them to training jobs: exact "
            "shuffling, parallel decode and augmentation, batches for NumPy, torch and JAX."
        ),
        epilog="Run 'shardfeed COMMAND --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on error")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _commands():
        doc = (module.__doc__ or "").strip()
        p = sub.add_parser(
            module.NAME,
            help=getattr(module, "HELP", doc.splitlines()[0] if doc else ""),
            description=doc or None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--debug", action="store_true", help="show full tracebacks on error")
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    from shardfeed.errors import ShardfeedError

    try:
        code = int(args._run(args))
        sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ShardfeedError, ValueError, TypeError, OSError) as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_closed():
            return _drop_stdout()
        if args.debug:
            raise
        kind = "error" if isinstance(exc, ShardfeedError) else type(exc).__name__
        print(f"shardfeed {args.command}: {kind}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (ValueError, TypeError)) else 1


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone (or cannot be told apart from one),
    so that a broken pipe of some other kind still fails loudly."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):  # no poll(), or no real stdout
        return True
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _drop_stdout() -> int:
    """Point stdout at /dev/null, so that flushing what is left at exit cannot fail again
    (Python would print "Exception ignored ... BrokenPipeError"); return 141."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return 141


if __name__ == "__main__":
    raise SystemExit(main())
