"""Check a dataset: every record's CRCs, optionally every image, and the manifest.

Reads every shard record by record and lists each bad record with its shard, record index,
byte offset and what is wrong: bad length CRC, bad data CRC, truncated, not a
tf.train.Example, undecodable image or mask (--decode), missing referenced file, a shard
whose size or checksum differs from the manifest. Exit status 1 if anything is wrong. A folder
whose pack did not finish is refused (exit 1): finish it with `shardfeed pack ... --resume`.

examples:
  shardfeed verify out/                    # a packed dataset (checks the manifest too)
  shardfeed verify out/ --decode           # also decode every image and mask
  shardfeed verify 'data/train-*' --json   # TFRecord files; machine-readable report
  shardfeed verify s3://bucket/ds/         # any URL Dataset opens (s3://, gs://, memory://)
  shardfeed verify tfrecords/ --decode --key image_raw --mask-key mask_raw \
      --mask-encoding raw --mask-height-key height --mask-width-key width
                                           # TensorFlow's guide layout: name the features
"""

from __future__ import annotations

import argparse
from typing import Any

from shardfeed.cli import common

NAME = "verify"
HELP = "check every CRC (and with --decode every image); list bad records"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+",
        help="dataset folder, manifest, folder of TFRecord files, glob, or files",
    )
    parser.add_argument("--decode", action="store_true", help="decode every image and mask")
    parser.add_argument(
        "--root", default=None,
        help="folder of referenced images (default: the root stored in the manifest)",
    )
    where = parser.add_argument_group(
        "where the image and mask are (with --decode; default: the manifest's schema, else the "
        "standard names image/encoded, image/raw, image/path and mask/...)")
    where.add_argument("--key", default=None,
                       help="the image's feature (JPEG or PNG bytes), as the decode ops' key=")
    where.add_argument("--mask-key", default=None, help="the mask's feature, as mask_key=")
    where.add_argument("--mask-encoding", choices=("auto", "raw"), default="auto",
                       help="raw: the mask is uint8 class ids, height x width of the "
                            "features --mask-height-key/--mask-width-key (default auto: PNG)")
    where.add_argument("--mask-height-key", default=None, help="as mask_height_key=")
    where.add_argument("--mask-width-key", default=None, help="as mask_width_key=")
    common.add_max_pixels(parser, what="with --decode a larger image is a bad record, as a "
                          "Loader would refuse it")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    common.add_workers(parser, what="check shards")
    common.add_dataset_options(parser)
    common.add_progress(parser)


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.verify import verify

    source = args.source[0] if len(args.source) == 1 else args.source
    image, mask = _slots(args)
    report = verify(
        source, decode=args.decode, root=args.root, workers=args.workers,
        progress=common.show_progress(args), max_pixels=args.max_pixels,
        image=image, mask=mask, **common.dataset_options(args),
    )
    if args.json:
        common.print_json(report.to_json())
        return 0 if report.ok else 1
    for warning in report.warnings:
        print(f"warning: {warning}")
    for problem in report.problems:
        print(problem)
    what = f"{common.count(report.records, 'record')} in {common.count(len(report.shards), 'shard')}"
    if report.decode:
        images = sum(s.images_decoded for s in report.shards)
        masks = sum(s.masks_decoded for s in report.shards)
        what += f", {common.count(images, 'image')}"
        what += f" and {common.count(masks, 'mask')} decoded" if masks else " decoded"
    if report.ok:
        print(f"ok: {what}")
        return 0
    print(f"FAILED: {common.count(len(report.problems), 'problem')}; {what}")
    return 1



def _slots(args: argparse.Namespace) -> tuple[Any, Any]:
    """The image and mask the options name (None for each left to the defaults)."""
    from shardfeed.format.schema import ImageInfo

    named = [f"--{name.replace('_', '-')}" for name in
             ("key", "mask_key", "mask_height_key", "mask_width_key")
             if getattr(args, name)] + (["--mask-encoding"] if args.mask_encoding != "auto"
                                        else [])
    if named and not args.decode:
        raise SystemExit(f"shardfeed verify: {', '.join(named)} say where images are, which "
                         "only --decode reads: add --decode")
    if args.mask_encoding == "raw" and not (args.mask_key and args.mask_height_key
                                            and args.mask_width_key):
        raise SystemExit("shardfeed verify: --mask-encoding raw needs --mask-key, "
                         "--mask-height-key and --mask-width-key")
    if args.mask_encoding != "raw" and (args.mask_height_key or args.mask_width_key):
        raise SystemExit("shardfeed verify: --mask-height-key and --mask-width-key are the "
                         "shape of a raw mask: add --mask-encoding raw")
    image = ImageInfo(args.key, "mixed") if args.key else None  # a manifest's own kept
    mask = None
    if args.mask_key:
        mask = (ImageInfo(args.mask_key, "raw", args.mask_height_key, args.mask_width_key)
                if args.mask_encoding == "raw" else ImageInfo(args.mask_key, "mixed"))
    return image, mask
