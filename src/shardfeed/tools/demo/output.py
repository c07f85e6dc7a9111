"""The demo's output folder: safe replacement of an earlier demo, and the printed summary.

The folder is built under a temporary sibling name and swapped in only when complete, so an
interrupted demo leaves the previous output whole. A folder is replaced only if it carries the
demo's marker file (:data:`MARKER_NAME`); anything else is refused, never deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

from shardfeed.tools.wording import count

__all__ = ["MARKER_NAME", "finish", "format_summary", "start"]

MARKER_NAME = ".shardfeed-demo"
_MARKER_TEXT = json.dumps({"what": "output of `shardfeed demo`; safe to delete", "version": 1})


def _is_demo(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MARKER_NAME))


def _check_replaceable(path: str) -> None:
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ValueError(
            f"--out '{path}' exists and is not a folder: choose another --out for the demo"
        )
    if os.listdir(path) and not _is_demo(path):
        raise ValueError(
            f"--out '{path}' is a non-empty folder that no demo wrote (it has no {MARKER_NAME} "
            f"file), so the demo will not replace it: choose another --out, or empty it"
        )


def start(out: str) -> str:
    """Check that ``out`` may be (re)placed and return the empty build folder to fill."""
    out = os.path.abspath(out)
    _check_replaceable(out)
    building = out + ".building"
    _check_replaceable(building)
    if os.path.lexists(building):
        shutil.rmtree(building)
    os.makedirs(building)
    with open(os.path.join(building, MARKER_NAME), "w", encoding="utf-8") as f:
        f.write(_MARKER_TEXT + "\n")
    return building


def finish(building: str, out: str) -> None:
    """Swap the complete ``building`` folder into ``out``, removing an earlier demo there."""
    out = os.path.abspath(out)
    _check_replaceable(out)
    old = out + ".old"
    if os.path.lexists(old):
        _check_replaceable(old)
        shutil.rmtree(old)
    if os.path.lexists(out):
        os.rename(out, old)
    os.rename(building, out)
    if os.path.lexists(old):
        shutil.rmtree(old)


def _decodes(n: int | None) -> str:
    return "image decodes not counted" if n is None else count(n, "image decode")


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def format_summary(summary: Mapping[str, Any], timings: Mapping[str, Any]) -> str:
    """The text the demo prints at the end (and writes to ``timings/summary.txt``)."""
    lines = [f"shardfeed demo: {summary['out']}", "", "datasets (packed, then verified):"]
    lines += _dataset_lines(summary)
    lines += _train_lines(summary, timings)
    lines += _window_lines(summary, timings)
    lines += _patch_lines(summary, timings)
    lines += _shuffle_lines(summary)
    lines += _bench_lines(summary, timings)
    return "\n".join(lines)


def _dataset_lines(summary: Mapping[str, Any]) -> list[str]:
    """One line a dataset: records, shards, bytes and what verify found."""
    lines: list[str] = []
    for name, info in summary["datasets"].items():
        verify = info["verify"]
        status = "ok" if verify["ok"] else count(verify["problems"], "PROBLEM")
        lines.append(
            f"  {name:<10} {count(info['records'], 'record'):>14}  "
            f"{count(info['shards'], 'shard'):>9}  {_mb(info['bytes']):>9}  verify {status} "
            f"({count(verify['decoded'], 'image')} decoded)  {info['what']}"
        )
    return lines


def _train_lines(summary: Mapping[str, Any], timings: Mapping[str, Any]) -> list[str]:
    """The training epoch: images, batch shapes, labels a batch, speed."""
    train = summary["train"]
    return [
        "",
        (f"train epoch over labelled (presets.train({train['size']}), batch {train['batch_size']},"
        f" shuffled, {count(train['threads'], 'thread')}):"),
        (f"  {count(train['images'], 'image')} in {count(train['batches'], 'batch')}, image "
        f"{train['image_shape']}, mask {train['mask_shape']}; "
        f"{train['labels_per_batch']:.1f} labels a batch "
        f"(a uniform shuffle: {train['expected_labels_per_batch']:.1f})"),
        f"  {timings['train']['images_per_s']:,.0f} images/s",
    ]


def _window_lines(summary: Mapping[str, Any], timings: Mapping[str, Any]) -> list[str]:
    """The windows: how many, the anchors excluded and why, speed."""
    win = summary["windows"]
    return [
        "",
        (f"windows over timelapse ({count(win['length'], 'frame')} {win['stride_seconds']:g} s "
        f"apart, no gap over {win['max_gap_seconds']:g} s):"),
        (f"  {count(win['windows'], 'window')} from {count(win['records'], 'frame')} in "
        f"{count(win['groups'], 'day')} "
        f"(excluded anchors: {win['excluded']['group_end']} at day ends, "
        f"{win['excluded']['off_grid']} off the 16 s grid, {win['excluded']['gap']} across a "
        f"gap); batch image {win['image_shape']}, labels {win['label_shape']}"),
        f"  {timings['windows']['windows_per_s']:,.0f} windows/s",
    ]


def _patch_lines(summary: Mapping[str, Any], timings: Mapping[str, Any]) -> list[str]:
    """The patches: how many, from how many images, speed and decodes."""
    pat = summary["patches"]
    return [
        "",
        (f"patches over highres ({pat['size']} px, cache {count(pat['cache_images'], 'image')}, "
        f"refresh every {pat['refresh_every']}):"),
        (f"  {count(pat['patches'], 'patch')} from {count(pat['images'], 'image')} in "
        f"{count(pat['batches'], 'batch')}, "
        f"{pat['distinct_images_per_batch']:.1f} images a batch"),
        (f"  {timings['patches']['patches_per_s']:,.0f} patches/s, "
        f"{_decodes(timings['patches']['decodes'])}"),
    ]


def _shuffle_lines(summary: Mapping[str, Any]) -> list[str]:
    """The shuffle table: the exact shuffle beside a shuffle buffer."""
    shuf = summary["shuffle"]
    lines = [
        "",
        (f"shuffle over labelled ({count(shuf['records'], 'record')} sorted by label, "
        f"{count(shuf['classes'], 'class')}):"),
        f"  {'':<26} {'rho':>7} {'last label first at':>20} {'labels/batch':>13}",
    ]
    for name in ("exact", "buffer"):
        row = shuf[name]
        lines.append(
            f"  {row['description']:<26} {row['rho']:>+7.3f} {row['latest_first_position']:>20,}"
            f" {row['labels_per_batch']:>13.2f}"
        )
    lines += [f"  plots: {', '.join(shuf['plots'])}"]
    return lines


def _bench_lines(summary: Mapping[str, Any], timings: Mapping[str, Any]) -> list[str]:
    """The bench figures, then what is identical every run."""
    bench = timings["bench"]
    return [
        "",
        (f"bench over timelapse ({bench['seconds']:.1f} s, {count(bench['threads'], 'thread')}): "
        f"{bench['images_per_s']:,.0f} images/s, decode limit "
        f"{bench['decode_limit_images_per_s']:,.0f} images/s "
        f"(ratio {bench['ratio_to_decode_limit']:.2f}), first batch "
        f"{bench['time_to_first_batch_s']:.3f} s; plot {bench['plot']}"),
        "",
        (f"identical every run: everything in {summary['out']} except timings/ "
        f"(total {timings['total_seconds']:.1f} s)"),
    ]
