"""shardfeed cache: what a disk cache folder holds; check it, or empty it.

A Loader over object storage keeps the records it read in ``Dataset(url, cache_dir=DIR)``
(see docs/dataset.md, "A local cache of remote shards"). This command shows what DIR holds:
entries and bytes against the bound, and the objects with the most bytes cached.
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "cache"
HELP = "show what a disk cache of remote records holds (--verify checks it, --clear empties it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="DIR", help="the cache_dir given to Dataset")
    parser.add_argument("--verify", action="store_true",
                        help="read every entry and check that it is its key's, whole, and "
                             "made with the cache's key (its MAC); damaged ones are removed "
                             "(they are fetched again when next read)")
    parser.add_argument("--clear", action="store_true",
                        help="remove every entry (safe while no loader uses the folder)")
    parser.add_argument("--objects", type=int, default=10, metavar="N",
                        help="objects to list, the most bytes cached first (default: 10)")
    parser.add_argument("--trust-cache-dir", action="store_true",
                        help="open a cache folder that another user owns or other users can "
                             "write (refused otherwise: they could plant entries or links)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.cache import cache_report

    report = cache_report(args.folder, verify=args.verify, clear=args.clear,
                          objects=args.objects, trust_cache_dir=args.trust_cache_dir)
    if args.json:
        common.print_json(report)
        return 1 if report["damaged"] else 0
    size = common.human_bytes
    print(f"{report['path']}: {report['entries']:,} entries, {size(report['bytes'])} of "
          f"{size(report['max_bytes'])}" + (f"; {report['reserved']} being written"
                                            if report["reserved"] else "")
          + (f" ({size(report['temp_bytes'])} in temp files)" if report["temp_bytes"] else ""))
    for obj in report["objects"]:
        print(f"  {size(obj['bytes']):>10}  {obj['entries']:>8,} records  {obj['url']}")
    if args.verify:
        print(f"checked: {len(report['damaged'])} damaged entries removed"
              if report["damaged"] else "checked: every entry is sound")
    if args.clear:
        print("cleared")
    return 1 if report["damaged"] else 0
