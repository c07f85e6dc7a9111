"""Merge the small shards that appends leave into the dataset's next version: the same records
in the same order, so its fingerprint is unchanged and every loader state restores on it.

Runs of consecutive shards under half the target size are merged, in order, into shards of
at most the target (default 64MB, or --records-per-shard); the new shards go to OUTPUT/vN/,
the earlier versions and their shards stay readable (Dataset(..., version=k)). On object
storage each merged shard is built locally and uploaded, then the version is committed by a
conditional PUT, as an append is.

examples:
  shardfeed compact timelapse/                       # after many appends of a day each
  shardfeed compact timelapse/ --shard-size 256MB
  shardfeed compact timelapse/ --records-per-shard 5000
  shardfeed compact s3://bucket/timelapse/
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "compact"
HELP = "merge an appended dataset's small shards (same records, order and fingerprint)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", help="the dataset folder or URL (s3://bucket/ds)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shard-size", default=None, metavar="SIZE",
                      help="the merged shards' size, e.g. 64MB (default)")
    size.add_argument("--records-per-shard", type=common.positive_int, default=None,
                      metavar="N", help="the merged shards' records instead")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from shardfeed.errors import PackError
    from shardfeed.tools.pack.compact import compact
    from shardfeed.tools.pack.plan import parse_size

    by_records = args.records_per_shard is not None
    target = args.records_per_shard if by_records else parse_size(args.shard_size or "64MB")
    try:
        result = compact(args.dataset, target=target, by_records=by_records)
    except PackError as exc:
        raise SystemExit(f"shardfeed compact: {exc}") from None
    if args.json:
        common.print_json(result.to_json())
    elif result.already_complete:
        print(f"nothing to compact: version {result.version} of {result.output} has no run of "
              f"small shards ({common.count(result.shards, 'shard')})")
    else:
        print(f"compacted: version {result.version} of {result.output} holds "
              f"{common.count(result.records, 'record')} in "
              f"{common.count(result.shards, 'shard')}, {common.human_bytes(result.bytes)}; "
              "same records, order and fingerprint")
    return 0
