"""Low-level geometric operations on decoded arrays, shared by every geometric transform.

Layouts: an image is H×W×C (or T×H×W×C for a window of frames); a mask is H×W (or T×H×W).
Images resize with linear interpolation (area averaging when shrinking 2× or more), masks
with nearest neighbour, so label values are never blended. OpenCV releases the GIL.
"""

from __future__ import annotations

import cv2
import numpy as np

from shardfeed.transforms.boxes import Box

#: Shrink factor (input/output, both dimensions) from which images resize with INTER_AREA.
AREA_SHRINK = 2.0


def opencv_on_callers() -> None:
    """Run OpenCV's operations on the thread that calls them (``cv2.setNumThreads(0)``, for
    the process): the loader's threads are the parallelism. OpenCV's own pool splits each
    resize over a worker a core, and its workers wait for the next one by spinning
    (``sched_yield``): beside one loader thread building ``presets.train(64)`` batches of
    160-427 px JPEGs on 2 cores they burnt 717 CPU µs an image against 444 with the pool
    off, for no more images (``bench/bench_opencv_pool.py``); on a node they would spin a
    worker a core beside the loader's threads. The pixels are the same either way."""
    cv2.setNumThreads(0)


def spatial_shape(arr: np.ndarray, *, is_mask: bool) -> tuple[int, int]:
    """``(height, width)`` of an image or mask array (frames leading, channels trailing)."""
    if is_mask:
        if arr.ndim not in (2, 3):
            raise ValueError(f"a mask must be H×W or T×H×W, got shape {arr.shape}")
        return int(arr.shape[-2]), int(arr.shape[-1])
    if arr.ndim not in (3, 4):
        raise ValueError(f"an image must be H×W×C or T×H×W×C, got shape {arr.shape}")
    return int(arr.shape[-3]), int(arr.shape[-2])


def crop(arr: np.ndarray, box: Box, *, is_mask: bool) -> np.ndarray:
    """A view of ``box`` (clipped to the array) of an image or mask."""
    ys = slice(box.y, box.y + box.h)
    xs = slice(box.x, box.x + box.w)
    if is_mask:
        return arr[..., ys, xs]
    return arr[..., ys, xs, :]


def interpolation_for(
    in_hw: tuple[int, int], out_hw: tuple[int, int], *, is_mask: bool
) -> int:
    """Nearest (pixel-center aligned, like the linear modes) for masks; INTER_AREA when
    shrinking ≥ 2× both ways; else INTER_LINEAR."""
    if is_mask:
        return cv2.INTER_NEAREST_EXACT
    if in_hw[0] >= AREA_SHRINK * out_hw[0] and in_hw[1] >= AREA_SHRINK * out_hw[1]:
        return cv2.INTER_AREA
    return cv2.INTER_LINEAR


def _resize_one(
    src: np.ndarray, out_hw: tuple[int, int], interpolation: int, out: np.ndarray | None
) -> np.ndarray:
    h, w = out_hw
    squeeze = src.ndim == 3 and src.shape[2] == 1  # cv2 drops a single channel axis
    plain = src[:, :, 0] if squeeze else src
    direct = (
        out is not None
        and out.dtype == src.dtype
        and out.flags.c_contiguous
        and out.shape == ((h, w, 1) if squeeze else (h, w) + src.shape[2:])
    )
    if direct and out is not None:
        target = out[:, :, 0] if squeeze else out
        cv2.resize(plain, (w, h), dst=target, interpolation=interpolation)
        return out
    result = cv2.resize(plain, (w, h), interpolation=interpolation)
    if squeeze:
        result = result[:, :, None]
    if out is not None:
        np.copyto(out, result, casting="unsafe")
        return out
    return result


def resize(
    arr: np.ndarray,
    out_hw: tuple[int, int],
    *,
    is_mask: bool,
    out: np.ndarray | None = None,
    interpolation: int | None = None,
) -> np.ndarray:
    """Resize an image or mask to ``out_hw`` (into ``out`` when given)."""
    in_hw = spatial_shape(arr, is_mask=is_mask)
    if interpolation is None:
        interpolation = interpolation_for(in_hw, out_hw, is_mask=is_mask)
    frames = arr.ndim == (3 if is_mask else 4)
    if not frames:
        if in_hw == out_hw and out is None:
            return arr
        return _resize_one(arr, out_hw, interpolation, out)
    shape = (arr.shape[0],) + out_hw + (() if is_mask else arr.shape[3:])
    target = out if out is not None else np.empty(shape, arr.dtype)
    for t in range(arr.shape[0]):
        _resize_one(arr[t], out_hw, interpolation, target[t])
    return target


def hflip(arr: np.ndarray, *, is_mask: bool, out: np.ndarray | None = None) -> np.ndarray:
    """Mirror left-right (into ``out`` when given)."""
    frames = arr.ndim == (3 if is_mask else 4)
    if not frames and arr.ndim >= 2 and (is_mask or arr.shape[2] <= 4):
        if out is not None and out.dtype == arr.dtype and out.flags.c_contiguous:
            cv2.flip(arr, 1, dst=out)
            return out
        flipped = cv2.flip(arr, 1)
        if flipped.ndim == arr.ndim - 1:
            flipped = flipped.reshape(arr.shape)
        if out is not None:
            np.copyto(out, flipped, casting="unsafe")
            return out
        return flipped
    view = arr[..., ::-1] if is_mask else arr[..., ::-1, :]
    if out is not None:
        np.copyto(out, view, casting="unsafe")
        return out
    return np.ascontiguousarray(view)


def crop_or_pad(
    arr: np.ndarray,
    out_hw: tuple[int, int],
    *,
    is_mask: bool,
    fill: float = 0,
    offset: tuple[int, int] | None = None,
) -> np.ndarray:
    """Center-crop dimensions larger than ``out_hw`` and pad smaller ones with ``fill``.

    ``offset=(dy, dx)`` places the window instead of centering: for a dimension that is
    cropped it is the start of the kept part, for one that is padded, where the data starts.
    """
    h, w = spatial_shape(arr, is_mask=is_mask)
    oh, ow = out_hw
    dy, dx = offset if offset is not None else (abs(h - oh) // 2, abs(w - ow) // 2)
    if h >= oh and w >= ow:
        return crop(arr, Box(dy, dx, oh, ow), is_mask=is_mask)
    lead = arr.shape[:-2] if is_mask else arr.shape[:-3]
    tail = () if is_mask else arr.shape[-1:]
    result = np.full(lead + (oh, ow) + tail, fill, dtype=arr.dtype)
    # Source window and destination position, per dimension.
    sy, ty, ch = (dy, 0, oh) if h >= oh else (0, dy, h)
    sx, tx, cw = (dx, 0, ow) if w >= ow else (0, dx, w)
    src = crop(arr, Box(sy, sx, ch, cw), is_mask=is_mask)
    if is_mask:
        result[..., ty : ty + ch, tx : tx + cw] = src
    else:
        result[..., ty : ty + ch, tx : tx + cw, :] = src
    return result


__all__ = [
    "AREA_SHRINK",
    "crop",
    "crop_or_pad",
    "hflip",
    "interpolation_for",
    "resize",
    "spatial_shape",
]
