"""The device half of a decode on the GPU: a batch of planned JPEG crops decoded, resized,
flipped, normalised and laid out on the device, as torch tensors.

The loader's threads run the CPU half
(:class:`~shardfeed.transforms.decode.device_plan.DevicePlan`, what
``presets.train(..., decode_on="cuda")`` builds): each row's box and flip drawn with its keyed
generator, the JPEG handed on. Here, in the thread that iterates, a batch at a time::

    rows planned for the device    nvImageCodec: one batched decode of every row's box
                                   (region decode) on a side CUDA stream
    each decoded box               resize to the output size (bilinear; antialiased when it
                                   shrinks 2x or more both ways, as the CPU path averages
                                   areas), flip if drawn
    rows made on the CPU, and      uploaded; a box the device decoder refuses is made on the
    boxes the decoder refuses      CPU with the op's own pixel work (decode_planned)
    the tail                       normalise / float / CHW as the preset asked
    hand-out                       the consumer's stream waits for the side stream

On a CPU device (``device="cpu"``) the same code runs with nvImageCodec's CPU backend: the
path tests take on machines without a GPU.

What to install: nvImageCodec and the nvJPEG wheel of torch's CUDA (``shardfeed[nvimgcodec-cu12]``
or ``[nvimgcodec-cu13]``); where either is missing, the error names the pip line that matches
``torch.version.cuda`` (:func:`~shardfeed.transforms.decode.region.install_hint`), and where
nvImageCodec found no libnvjpeg, the wheel or the ``LD_LIBRARY_PATH`` folder it needs
(:func:`~shardfeed.transforms.decode.region.nvjpeg_hint`). The nvJPEG wheel may lie in another
``sys.path`` folder than nvImageCodec: :func:`~shardfeed.transforms.decode.region.backend`
loads it from there before nvImageCodec's import looks for it.

EXIF orientation: the decoder is handed ``DecodeParams(apply_exif_orientation=False)``
(:func:`~shardfeed.transforms.decode.region.no_turn`; nvImageCodec's default turns a tagged
JPEG), so the device decodes the stored pixels of each box, as every CPU path does by
default; where the plan's op has ``exif_orientation="apply"``, a JPEG its tag turns is made
on the CPU by the plan, never here.

Boxes and flips are the CPU path's for the same seed; pixels are not bit-identical to it (a
GPU IDCT and bilinear resize differ from libjpeg and OpenCV by a few grey levels).

Determinism: a function of the batch (same boxes, flips; the GPU's own arithmetic).
State: none (the loader's). Memory: on the device, the batch's decoded boxes and its outputs
(``device_bytes`` in ``memory_budget()``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.nn import functional
from torch.utils.dlpack import from_dlpack

from shardfeed.errors import DecodeError
from shardfeed.loaders.numpy import AdaptedLoader
from shardfeed.pipeline.memory import MemoryBudget
from shardfeed.transforms.base import Compose
from shardfeed.transforms.color import IMAGENET_MEAN, IMAGENET_STD
from shardfeed.transforms.decode import region
from shardfeed.transforms.decode.device_plan import PLAN_KEYS, DevicePlan, decode_planned

Batch = dict[str, Any]

__all__ = ["DeviceAdapted", "DeviceDecode", "plan_of"]


def plan_of(transform: Any) -> DevicePlan | None:
    """The loader's :class:`DevicePlan` (itself, or a Compose's only op), else None."""
    if isinstance(transform, Compose) and len(transform) == 1:
        transform = next(iter(transform))
    return transform if isinstance(transform, DevicePlan) else None


class DeviceDecode:
    """Make ``plan``'s batches on ``device`` (see the module doc); ``channels_first`` also
    lays the images out C×H×W (as the plan's ``layout="CHW"`` does)."""

    def __init__(self, plan: DevicePlan, device: torch.device, *,
                 channels_first: bool = False) -> None:
        module = region.backend()
        if module is None:
            raise ValueError(
                f"decoding on the device needs nvImageCodec: "
                f"{region.install_hint(torch.version.cuda)}; or decode on the CPU "
                "(presets' decode_on='cpu')"
            )
        found = region.libraries()
        if device.type == "cuda" and found is not None and not found.nvjpeg_loaded:
            raise ValueError(
                "decoding on the GPU needs nvJPEG, and nvImageCodec found no libnvjpeg: "
                f"{region.nvjpeg_hint(found, torch.version.cuda)}; or decode on the CPU "
                "(presets' decode_on='cpu')"
            )
        self.plan, self.device, self.module = plan, device, module
        self.channels_first = channels_first or plan.tail.layout == "CHW"
        op = plan.op
        options = f":fast_idct={int(op.fast_dct)} :fancy_upsampling={int(not op.fast_upsample)}"
        if device.type == "cuda":
            self.decoder = module.Decoder(device_id=device.index or 0, options=options)
            self.stream: torch.cuda.Stream | None = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        else:
            self.decoder = module.Decoder(
                device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                backends=[module.Backend(module.BackendKind.CPU_ONLY)], options=options)
            self.stream = None
        self.params = region.no_turn(module)  # the stored pixels: the plan turns none here
        self.mean = torch.tensor(IMAGENET_MEAN, device=device)
        self.std = torch.tensor(IMAGENET_STD, device=device)
        self.peak_region_bytes = 0
        self.fallbacks = 0  # rows planned for the device that the CPU made instead

    def device_bytes(self, batch_size: int) -> int:
        """The device memory a batch holds at most: two batches of outputs (one handed out,
        one being made), and the decoded boxes of the largest batch so far."""
        h, w = self.plan.size
        per_row = h * w * 3 * (1 + (4 if self.plan.tail.dtype == "float32" else 0))
        return 2 * batch_size * per_row + self.peak_region_bytes

    def __call__(self, batch: Batch) -> Batch:
        rows = len(batch["plan/encoded"])
        h, w = self.plan.size
        stream = self.stream
        context = torch.cuda.stream(stream) if stream is not None else _NoStream()
        with context:
            images = torch.empty((rows, h, w, 3), dtype=torch.uint8, device=self.device)
            made_here = self._device_rows(batch, images)
            if made_here:
                pixels = np.ascontiguousarray(batch["image"][made_here])
                index = torch.as_tensor(made_here, device=self.device)
                images[index] = torch.from_numpy(pixels).to(self.device, non_blocking=True)
            result = self._tail(images)
        if stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            result.record_stream(current)
        out: Batch = {}
        for name, value in batch.items():
            if name in PLAN_KEYS or name == "image":
                continue
            out[name] = (torch.from_numpy(value).to(self.device, non_blocking=True)
                         if isinstance(value, np.ndarray) else value)  # lists stay lists
        out["image"] = result
        return out

    def _device_rows(self, batch: Batch, images: torch.Tensor) -> list[int]:
        """Decode the rows planned for the device into ``images``; returns the rows whose
        pixels are made on the CPU (``batch["image"]``, the refused ones filled in there)."""
        on_cpu = np.asarray(batch["plan/on_cpu"]).astype(bool)
        planned = np.flatnonzero(~on_cpu).tolist()
        made_here = np.flatnonzero(on_cpu).tolist()
        if not planned:
            return made_here
        boxes, flips = np.asarray(batch["plan/box"]), np.asarray(batch["plan/flip"])
        decoded = self._decode([batch["plan/encoded"][r] for r in planned], boxes[planned])
        refused: list[int] = []
        for row, region_pixels in zip(planned, decoded):
            if region_pixels is None:
                refused.append(row)
                continue
            images[row] = self._resize_flip(region_pixels, bool(flips[row]))
        if refused:
            batch["image"] = np.array(batch["image"])  # the loader's memory stays as it was
            for row in refused:
                self._on_cpu(batch, row)
            self.fallbacks += len(refused)
        return sorted(made_here + refused)

    def _decode(self, encoded: list[bytes], boxes: np.ndarray) -> list[torch.Tensor | None]:
        """Each JPEG's box decoded (HWC uint8 on the device), None where refused."""
        module = self.module
        streams = []
        for data, (y, x, h, w) in zip(encoded, boxes.tolist()):
            code = module.CodeStream(bytes(data))
            streams.append(code.get_sub_code_stream(
                region=module.Region(start=(y, x), end=(y + h, x + w))))
        cuda_stream = self.stream.cuda_stream if self.stream is not None else 0
        try:
            images = self.decoder.decode(streams, params=self.params, cuda_stream=cuda_stream)
        except Exception:  # noqa: BLE001 - a batch the decoder refuses whole: row by row
            images = [None] * len(streams)
        result: list[torch.Tensor | None] = []
        total = 0
        for image, (_, _, h, w) in zip(images, boxes.tolist()):
            tensor = None if image is None else self._as_tensor(image)
            if tensor is not None and (tuple(tensor.shape) != (h, w, 3)
                                       or tensor.dtype != torch.uint8):
                tensor = None
            total += 0 if tensor is None else tensor.numel()
            result.append(tensor)
        self.peak_region_bytes = max(self.peak_region_bytes, total)
        return result

    def _as_tensor(self, image: Any) -> torch.Tensor:
        if self.device.type == "cuda":
            return from_dlpack(image)
        return torch.from_numpy(np.asarray(image.cpu()))

    def _resize_flip(self, pixels: torch.Tensor, flip: bool) -> torch.Tensor:
        """One decoded box (H×W×3 uint8) resized to the output size and flipped: H×W×3."""
        out_h, out_w = self.plan.size
        h, w = int(pixels.shape[0]), int(pixels.shape[1])
        chw = pixels.permute(2, 0, 1).unsqueeze(0).float()
        if (h, w) != (out_h, out_w):
            shrink = h >= 2 * out_h and w >= 2 * out_w
            chw = functional.interpolate(chw, size=(out_h, out_w), mode="bilinear",
                                         align_corners=False, antialias=shrink)
        if flip:
            chw = chw.flip(3)
        return chw.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0)

    def _on_cpu(self, batch: Batch, row: int) -> None:
        names = batch.get("image/filename")
        where = (f"batch row {row} (file name {names[row]!r})"
                 if isinstance(names, list) and row < len(names) else f"batch row {row}")
        try:
            decode_planned(self.plan, batch["plan/encoded"][row], batch["plan/box"][row],
                           batch["plan/image_hw"][row], bool(batch["plan/flip"][row]),
                           batch["image"][row], where=where)
        except DecodeError as exc:
            raise DecodeError(
                f"{exc}; the GPU decoder refused it too. Find the record with "
                "`shardfeed verify --decode`, or load with on_error='skip' on the CPU path "
                "(decode_on='cpu')"
            ) from None

    def _tail(self, images: torch.Tensor) -> torch.Tensor:
        tail = self.plan.tail
        result = images
        if tail.normalize is not None or tail.dtype == "float32":
            result = images.float().div_(255.0)
            if tail.normalize == "imagenet":
                result = result.sub_(self.mean).div_(self.std)
            elif tail.normalize == "symmetric":
                result = result.mul_(2.0).sub_(1.0)
        if self.channels_first:
            result = result.permute(0, 3, 1, 2)
        return result.contiguous()


class _NoStream:
    """Stands in for ``torch.cuda.stream(...)`` on a CPU device."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class DeviceAdapted(AdaptedLoader):
    """A loader whose plan batches are made on the device by ``decode``; its
    ``memory_budget()`` adds the device's bytes (``device_bytes``)."""

    def __init__(self, loader: Any, decode: DeviceDecode, /) -> None:
        super().__init__(loader, decode)
        self.decode = decode

    def memory_budget(self) -> MemoryBudget:
        budget: MemoryBudget = self.loader.memory_budget()
        batch_size = int(self.loader.options.batch_size)
        return dataclasses.replace(budget, device_bytes=self.decode.device_bytes(batch_size))
