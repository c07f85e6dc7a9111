"""Index existing TFRecord files so shardfeed (and DALI) can read them by offset.

Writes NAME.idx (DALI's text format) and NAME.idx.npy beside each file, in parallel, and a
shardfeed.json manifest (beside the files, or at --manifest) so shardfeed.Dataset(folder)
opens them. --group-key/--order-key read those features from every record into the
manifest's sidecars (for sequences). GZIP/ZLIB files cannot be indexed: re-pack them with
`shardfeed pack --from-tfrecord`.

examples:
  shardfeed index existing/*.tfrecord
  shardfeed index existing/ --group-key day --order-key timestamp
  shardfeed index 'gs-copy/train-*' --manifest train.json --workers 8
"""

from __future__ import annotations

import argparse

from shardfeed.cli import common

NAME = "index"
HELP = "build .idx indexes and a manifest for existing TFRecord files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="TFRecord files, a folder of them, or a glob")
    parser.add_argument("--manifest", default=None,
                        help="where to write the manifest (default: shardfeed.json beside the "
                             "first file)")
    parser.add_argument("--group-key", default=None, metavar="FEATURE",
                        help="feature holding each record's group (e.g. day)")
    parser.add_argument("--order-key", default=None, metavar="FEATURE",
                        help="feature holding each record's order key in seconds")
    common.add_workers(parser, what="index files")
    common.add_progress(parser)


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.index import index_files

    result = index_files(
        args.files, manifest=args.manifest, group_key=args.group_key,
        order_key=args.order_key, workers=args.workers, progress=common.show_progress(args),
    )
    print(
        f"indexed {common.count(result.records, 'record')} in "
        f"{common.count(result.files, 'file')} "
        f"({common.human_bytes(result.bytes)}): {result.manifest}"
    )
    return 0
