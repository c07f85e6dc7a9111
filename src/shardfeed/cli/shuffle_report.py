"""Show how random an epoch's order is: shardfeed's exact shuffle vs a shuffle buffer.

Reads the label of every record, then compares, on this dataset, the order of one epoch under
shardfeed's exact shuffle with the order a shuffle buffer gives (tf.data's
shuffle(buffer_size), DALI's random_shuffle, WebDataset's shuffle), and with --file-shuffle
also shards shuffled first, then the buffer. For each order it prints:

  rho           Spearman correlation of output position vs stored index (0 for a fair
                shuffle, 1 for no shuffle; a buffer over sorted data stays near 1)
  displacement  mean |position - index| / n (1/3 for a fair shuffle, 0 for none)
  chi2 p        chi-square test of position decile x index decile; below 0.001 the order
                is measurably not a uniform shuffle
  last class    the position where the last class to appear comes out first (a buffer
                over label-sorted data keeps whole classes out of the early epoch)
  labels/batch  mean distinct labels in a batch, next to what a fair shuffle gives

PATH is a dataset folder, a manifest, a folder of TFRecord files, a glob or TFRecord files;
or a .npy file of labels (one per record, stored order) to ask what a buffer would do to data
sorted like that, without any shards.

examples:
  shardfeed shuffle-report data/train --out report/        # table + two PNG plots
  shardfeed shuffle-report data/train --buffer 1000 --file-shuffle
  shardfeed shuffle-report 'shards/train-*.tfrecord' --label-key label --json
  shardfeed shuffle-report labels.npy --buffer 10000       # labels only, no shards
"""

from __future__ import annotations

import argparse
from typing import Any

from shardfeed.cli import common

NAME = "shuffle-report"
HELP = "measure how random an epoch is: exact shuffle vs a shuffle buffer (table, plots)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source", nargs="+", metavar="PATH",
        help="dataset folder, manifest, folder of TFRecord files, glob, files, or labels.npy",
    )
    parser.add_argument(
        "--label-key", default=None, metavar="K",
        help="label feature (default: the schema's label, else image/class/label)",
    )
    parser.add_argument(
        "--buffer", type=common.positive_int, default=10_000, metavar="B",
        help="shuffle buffer size to compare with (default: 10000)",
    )
    parser.add_argument("--seed", type=common.non_negative_int, default=0, metavar="S",
                        help="shuffle seed (default: 0)")
    parser.add_argument("--epoch", type=common.non_negative_int, default=0, metavar="E",
                        help="epoch whose order is measured (default: 0)")
    parser.add_argument(
        "--file-shuffle", action="store_true",
        help="also measure shards read in shuffled order followed by the buffer",
    )
    parser.add_argument("--batch", type=common.positive_int, default=256, metavar="N",
                        help="batch size for labels per batch (default: 256)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="write position_vs_index.png and label_vs_position.png here")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    common.add_progress(parser)


class _Bar:
    """A tqdm bar created on the first report, shown only if reading lasts over a second."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="rec", unit_scale=True, delay=1.0,
                             desc="reading labels", leave=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _p_value(p: float) -> str:
    if p == 0.0:
        return "<1e-300"
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def _verdict(name: str, p: float) -> str:
    if name == "stored":
        return "not shuffled"
    return "looks uniform" if p >= 1e-3 else "BIASED"


def format_table(report: dict[str, Any]) -> str:
    """The text summary printed by the command."""
    classes = report["classes"]
    labelled = classes is not None
    what = f"{report['records']:,} records"
    if labelled:
        what += f", {classes:,} classes"
        if report["label_key"]:
            what += f" in {report['label_key']!r}"
    lines = [
        f"shuffle report: {report['source']}",
        (
            f"  {what}; seed {report['seed']}, epoch {report['epoch']}, "
            f"buffer {report['buffer_size']:,}, batch {report['batch_size']:,}"
        ),
        "",
    ]
    header = f"  {'order':<32} {'rho':>6} {'displ.':>6} {'chi2 p':>7}"
    if labelled:
        header += f" {'last class from':>17} {'labels/batch':>12}"
    lines += [header + "  verdict", "  " + "-" * (len(header) + 12)]
    for name, stats in report["orders"].items():
        row = (
            f"  {stats['description']:<32} {stats['spearman_rho']:>+6.3f} "
            f"{stats['mean_abs_displacement']:>6.3f} {_p_value(stats['chi2_p_value']):>7}"
        )
        if labelled:
            label = str(stats["latest_label"])
            label = label if len(label) <= 8 else label[:7] + "\u2026"
            latest = f"{stats['latest_first_position']:,} ({label})"
            row += f" {latest:>17} {stats['mean_labels_per_batch']:>12.2f}"
        lines.append(row + "  " + _verdict(name, stats["chi2_p_value"]))
    fair = f"  {'a uniform shuffle gives':<32} {'~0':>6} {'~0.333':>6} {'>0.001':>7}"
    if labelled:
        fair += f" {'':>17} {report['expected_labels_per_batch']:>12.2f}"
    lines.append(fair)
    if report["plots"]:
        lines += ["", "plots: " + ", ".join(report["plots"].values())]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from shardfeed.tools.shuffle_report import shuffle_report

    sources: list[str] = list(args.source)
    source: Any = sources[0]
    opened: Any = None
    if len(sources) == 1 and sources[0].endswith(".npy"):
        import numpy as np

        if args.file_shuffle:
            raise ValueError(
                f"--file-shuffle needs shards, and {sources[0]} holds labels only: "
                f"give the dataset path instead"
            )
        source = np.load(sources[0], allow_pickle=False)
    elif len(sources) > 1:
        from shardfeed.dataset import Dataset

        source = opened = Dataset(sources)
    bar = _Bar() if common.show_progress(args) else None
    try:
        report = shuffle_report(
            source, label_key=args.label_key, buffer_size=args.buffer, seed=args.seed,
            epoch=args.epoch, file_shuffle=args.file_shuffle, batch_size=args.batch,
            out_dir=args.out, progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
        if opened is not None:
            opened.close()
    report["source"] = " ".join(sources)
    if args.json:
        common.print_json(report)
    else:
        print(format_table(report))
    return 0
