"""Run shardfeed's main jobs end to end on datasets built from bundled photographs.

Builds three small datasets from scikit-image's photographs (no download) in the shapes of
real use cases, then packs, verifies, trains, windows, patches, reports and benches:

  timelapse   4 days x 40 frames 8 s apart, 23 float labels, day + timestamp columns
              -> windows of 3 frames 16 s apart, never across a day or a gap; a short bench
  highres     8 photographs upscaled to 1024-1566 px -> cached random 64 px patches
  labelled    2,000 64 px crops, 10 labels sorted ascending, a PNG mask each
              -> a shuffled train epoch with masks; the shuffle report (exact shuffle vs a
                 shuffle buffer, with plots)

Everything in --out is identical from run to run except timings/. An --out folder written by
an earlier demo is replaced; any other non-empty folder is refused.

examples:
  shardfeed demo                       # writes demo-out/
  shardfeed demo --out /tmp/demo --quick
  shardfeed demo --json                # the figures as JSON
"""

from __future__ import annotations

import argparse
import sys

from shardfeed.cli import common

NAME = "demo"
HELP = "build datasets from bundled photographs and run the main jobs on them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="demo-out", metavar="DIR",
                        help="output folder (default: demo-out)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller datasets and a shorter bench (a few seconds)")
    parser.add_argument("--workers", type=common.positive_int, default=2, metavar="N",
                        help="threads for packing, verifying and loading (default: 2)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary and timings as JSON instead of text")


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.demo import demo

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = demo(args.out, quick=args.quick, workers=args.workers, report=report)
    if args.json:
        common.print_json({"summary": result["summary"], "timings": result["timings"]})
    else:
        print(result["text"])
    ok = all(info["verify"]["ok"] for info in result["summary"]["datasets"].values())
    return 0 if ok else 1
