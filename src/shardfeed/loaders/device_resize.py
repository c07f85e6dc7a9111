"""Crops of many sizes resized and flipped to one output size in a few batched kernels.

Every row's decoded pixels lie in one flat ``(P, 3)`` uint8 tensor (the decoder's images
concatenated); row ``n``'s box starts at pixel ``origin[n]`` and its rows are ``pitch[n]``
pixels apart (the box itself for a region decode, the whole image for a whole decode). The
resize is separable, a matrix a row and an axis::

    out[n] = Ry[n] · box[n] · Rx[n]ᵀ        Ry: out_h × Hmax,  Rx: out_w × Wmax (flip folded in)

Weights per axis, for a box of L pixels made O: shrinking (L > O), each output pixel averages
the source pixels its footprint ``[i·L/O, (i+1)·L/O)`` covers, by overlap (OpenCV's
``INTER_AREA``, what the CPU path shrinks with); otherwise bilinear at pixel centers, clamped
at the edges (``INTER_LINEAR``). Weights past a box's own size are 0, so boxes are padded to
the batch's largest (a gather) and the whole batch is two batched matrix products. Rows go
through in chunks whose scratch stays under ``scratch_bytes``.

Pixels differ from the CPU path's only where the CPU decoded at a DCT scale (a box 2× the
output or more) or by the decoders' IDCTs: measured on nvImageCodec's CPU backend, a mean
absolute difference per image of 0.68 grey levels (median; largest 2.70 of 80 images),
checked against 3.5 (tests/loaders/test_device_stage.py). Against OpenCV's resize of the same
pixels: at most 1 level apart.

Determinism: a function of the pixels, boxes and flips (the device's float arithmetic).
State: none. Memory: ``chunk_bytes`` of scratch on the device.
"""

from __future__ import annotations

import torch

__all__ = ["axis_weights", "chunk_rows", "resize_boxes", "row_scratch_bytes"]


def axis_weights(lengths: torch.Tensor, out: int, longest: int, *,
                 flips: torch.Tensor | None = None) -> torch.Tensor:
    """``(N, out, longest)`` float32 weights taking each row's ``lengths[n]`` source pixels
    to ``out`` pixels (reversed where ``flips``); 0 past a row's length."""
    device = lengths.device
    length = lengths.to(torch.float32).view(-1, 1, 1)
    i = torch.arange(out, device=device, dtype=torch.float32).view(1, -1, 1)
    if flips is not None:
        i = torch.where(flips.view(-1, 1, 1), out - 1 - i, i)
    j = torch.arange(longest, device=device, dtype=torch.float32).view(1, 1, -1)
    scale = length / out
    # shrinking: overlap of source pixel [j, j+1) with the footprint [i·s, (i+1)·s), over s
    lo, hi = i * scale, (i + 1) * scale
    area = (torch.minimum(j + 1, hi) - torch.maximum(j, lo)).clamp_(min=0) / scale
    # otherwise: bilinear at the center (i + 0.5)·s - 0.5, clamped into the row
    center = ((i + 0.5) * scale - 0.5).clamp(min=0)
    center = torch.minimum(center, length - 1)
    linear = (1 - (j - center).abs()).clamp_(min=0)
    weights = torch.where(length > out, area, linear)
    return weights.masked_fill_(j >= length, 0.0)


def row_scratch_bytes(longest_h: int, longest_w: int, out_h: int, out_w: int) -> int:
    """Device scratch one row takes in :func:`resize_boxes` (gather index, padded box as
    bytes and floats, weights, the first pass and its transpose)."""
    padded = longest_h * longest_w
    return (padded * (8 + 3 + 12) + 4 * (out_h * longest_h + out_w * longest_w)
            + 2 * 12 * out_h * longest_w)


def chunk_rows(rows: int, per_row_bytes: int, scratch_bytes: int) -> int:
    """Rows a chunk takes so that its scratch stays under ``scratch_bytes`` (at least 1)."""
    return max(1, min(rows, scratch_bytes // max(1, per_row_bytes)))


def resize_boxes(flat: torch.Tensor, origin: torch.Tensor, pitch: torch.Tensor,
                 hw: torch.Tensor, flips: torch.Tensor, size: tuple[int, int], *,
                 scratch_bytes: int, longest: tuple[int, int] | None = None) -> torch.Tensor:
    """Every row's box resized to ``size`` and flipped where ``flips``: ``(N, H, W, 3)`` uint8.

    ``flat``: ``(P, 3)`` uint8 pixels; ``origin``, ``pitch``: int64 ``(N,)`` in pixels;
    ``hw``: int64 ``(N, 2)`` box heights and widths; ``flips``: bool ``(N,)``; ``longest``:
    the largest height and width when the caller knows them (else read from ``hw``, which
    waits for the device's queued work). See the module docstring.
    """
    out_h, out_w = size
    rows = int(hw.shape[0])
    result = torch.empty((rows, out_h, out_w, 3), dtype=torch.uint8, device=flat.device)
    if rows == 0:
        return result
    longest_h, longest_w = longest or (int(v) for v in hw.max(dim=0).values.tolist())
    step = chunk_rows(rows, row_scratch_bytes(longest_h, longest_w, out_h, out_w),
                      scratch_bytes)
    ys = torch.arange(longest_h, device=flat.device).view(1, -1, 1)
    xs = torch.arange(longest_w, device=flat.device).view(1, 1, -1)
    for lo in range(0, rows, step):  # a few chunks, never a row at a time
        hi = min(rows, lo + step)
        h, w = hw[lo:hi, 0].view(-1, 1, 1), hw[lo:hi, 1].view(-1, 1, 1)
        # pixels past a box repeat its last row/column: their weights are 0
        index = (origin[lo:hi].view(-1, 1, 1) + torch.minimum(ys, h - 1) * pitch[lo:hi].view(-1, 1, 1)
                 + torch.minimum(xs, w - 1))
        boxes = flat.index_select(0, index.view(-1)).view(hi - lo, longest_h, longest_w * 3)
        ry = axis_weights(hw[lo:hi, 0], out_h, longest_h)
        rx = axis_weights(hw[lo:hi, 1], out_w, longest_w, flips=flips[lo:hi])
        tall = torch.bmm(ry, boxes.to(torch.float32))  # (n, out_h, Wmax·3)
        across = tall.view(hi - lo, out_h, longest_w, 3).transpose(1, 2).reshape(
            hi - lo, longest_w, out_h * 3)
        made = torch.bmm(rx, across).view(hi - lo, out_w, out_h, 3).transpose(1, 2)
        result[lo:hi] = made.round_().clamp_(0, 255).to(torch.uint8)
    return result
