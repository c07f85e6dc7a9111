"""Helpers shared by the command modules: JSON output, size arguments, worker counts, and
the options every command that reads a dataset takes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from shardfeed.pipeline.cores import usable_cores


def add_workers(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--workers N`` (default: the number of CPUs, at most 8)."""
    parser.add_argument(
        "--workers", type=positive_int, default=default_workers(), metavar="N",
        help=f"{what} in parallel with N threads (default: {default_workers()})",
    )


def add_dataset_options(parser: argparse.ArgumentParser) -> None:
    """``--allow-outside-paths``, for every command that reads a dataset (verify, inspect,
    bench, shuffle-report); read back with :func:`dataset_options`."""
    parser.add_argument(
        "--allow-outside-paths", action="store_true",
        help="read a dataset whose manifest or records name files outside it (shards "
             "elsewhere, an image root far away, absolute image paths, links out); by "
             "default such paths are refused. Use it only for datasets you trust",
    )


def dataset_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords :func:`add_dataset_options` gives the tools (``allow_outside_paths``)."""
    return {"allow_outside_paths": bool(getattr(args, "allow_outside_paths", False))}


def add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false",
        help="do not draw a progress bar (it is drawn on stderr only when it is a terminal)",
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to stderr, and only when it is a terminal."""
    return bool(getattr(args, "progress", True)) and sys.stderr.isatty()


def default_workers() -> int:
    """The CLI's default worker count: the cores this process may use (its affinity and its
    control group's quota), at most 8."""
    return max(1, min(8, usable_cores()))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON to stdout (NumPy scalars and arrays made plain)."""
    json.dump(data, sys.stdout, indent=2, default=_plain)
    sys.stdout.write("\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def human_bytes(n: float) -> str:
    """``123456789`` -> ``'123.5 MB'`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``count(1, "shard")`` is ``1 shard``; ``count(2, "shard")`` is ``2 shards``;
    ``count(3, "class")`` is ``3 classes`` (see :func:`shardfeed.tools.wording.count`)."""
    from shardfeed.tools.wording import count as worded

    return worded(n, noun, plural)


def add_max_pixels(parser: Any, *, what: str) -> None:
    """``--max-pixels N``: the most pixels one image may have (read from its header)."""
    from shardfeed.transforms.decode.sizes import DEFAULT_MAX_PIXELS

    parser.add_argument(
        "--max-pixels", type=positive_int, default=DEFAULT_MAX_PIXELS, metavar="N",
        help=f"the most pixels one image may have, read from its header before decoding; "
             f"{what} (default: {DEFAULT_MAX_PIXELS}, 16384x8192)",
    )
