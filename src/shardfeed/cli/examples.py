"""Write the small example files that the examples of the README and the guides use.

Every example in README.md and docs/ runs as written inside this folder:

  shardfeed examples ex/ && cd ex/

It holds images (photos/ in class sub-folders, masks/, time-lapse frames/, large/), their
CSVs (labels.csv, frames.csv), the same packed into datasets (out/, days/, big/), and
TFRecord files written by TensorFlow (existing/, old/ compressed with GZIP, damaged/). Only
shardfeed's own dependencies are needed; the files are the same on every run. DIR must be new
or empty.
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "examples"
HELP = "write the small example files that the README's and guides' examples use"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="a new or empty folder to write into")
    parser.add_argument("--json", action="store_true",
                        help="print the folder and what it holds as JSON")


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.demo.examples import EXAMPLE_FILES, write_examples

    written = write_examples(args.folder)
    if args.json:
        common.print_json({"folder": written.folder, "files": EXAMPLE_FILES})
        return 0
    print(f"example files in {written.folder}:")
    width = max(len(name) for name in written.names)
    for name in written.names:
        print(f"  {name:<{width}}  {EXAMPLE_FILES[name]}")
    print(f"run the examples of README.md and docs/ from there: cd {args.folder}")
    return 0
