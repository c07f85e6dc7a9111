"""Mask files as users have them (a unique module name: tests/ is not a package).

Palette PNGs are written with Pillow (mode "P", the PASCAL VOC palette), so that the files
are the ones a segmentation dataset ships, not something shardfeed wrote for itself.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from shardfeed.cli.main import main

IDS = (0, 1, 2, 255)  # background, two classes, VOC's "ignore" border


def voc_palette() -> np.ndarray:
    """The 256 colours of the PASCAL VOC palette (1 → (128, 0, 0), 255 → (224, 224, 192))."""
    palette = np.zeros((256, 3), dtype=np.uint8)
    for i in range(256):
        c, rgb = i, [0, 0, 0]
        for bit in range(8):
            for channel in range(3):
                rgb[channel] |= ((c >> channel) & 1) << (7 - bit)
            c >>= 3
        palette[i] = rgb
    return palette


VOC = voc_palette()
VOC_COLORS = {tuple(int(v) for v in VOC[i]): i for i in IDS}  # (r, g, b) → class id


def index_pattern(height: int, width: int, seed: int) -> np.ndarray:
    """An H×W uint8 label map holding each id of IDS, in blocks placed by ``seed``."""
    rng = np.random.default_rng(seed)
    labels = np.zeros((height, width), dtype=np.uint8)
    for class_id in IDS[1:]:
        h, w = int(rng.integers(4, height // 2)), int(rng.integers(4, width // 2))
        y, x = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
        labels[y:y + h, x:x + w] = class_id
    labels[0, 0] = 0
    return labels


def palette_png(indices: np.ndarray, *, palette: np.ndarray = VOC, bits: int = 8,
                transparency: int | None = None) -> bytes:
    """``indices`` as a palette PNG written by Pillow (``bits`` per pixel)."""
    height, width = indices.shape
    image = Image.frombytes("P", (width, height), np.ascontiguousarray(indices).tobytes())
    image.putpalette(palette[: 1 << bits].reshape(-1).tolist())
    options: dict[str, int] = {"bits": bits} if bits < 8 else {}
    if transparency is not None:
        options["transparency"] = transparency
    out = io.BytesIO()
    image.save(out, format="PNG", **options)
    data = out.getvalue()
    assert data[25] == 3 and data[24] == bits  # colour type 3: a palette PNG, as asked
    return data


def rgb_png(pixels: np.ndarray) -> bytes:
    """H×W×3 RGB pixels as an RGB PNG written by Pillow."""
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels), mode="RGB").save(out, format="PNG")
    return out.getvalue()


def grey16_png(values: np.ndarray) -> bytes:
    """H×W uint16 values as a 16-bit grey PNG written by Pillow."""
    out = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(values.astype(np.uint16)))
    assert image.mode == "I;16"
    image.save(out, format="PNG")
    data = out.getvalue()
    assert data[24] == 16 and data[25] == 0
    return data


def write_seg_csv(folder: Path, masks: list[bytes], *, size: int = 32) -> Path:
    """``folder/seg.csv`` (``path,label,mask``): one image a mask, label = its number.

    Image i is the VOC colour of mask i's labels when mask i is a palette PNG of the
    standard pattern, else a plain picture; it is a lossless PNG either way.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["path,label,mask"]
    for i, mask in enumerate(masks):
        picture = VOC[index_pattern(size, size, i)]
        (folder / f"im{i}.png").write_bytes(rgb_png(picture))
        (folder / f"mask{i}.png").write_bytes(mask)
        lines.append(f"im{i}.png,{i},mask{i}.png")
    csv = folder / "seg.csv"
    csv.write_text("\n".join(lines) + "\n")
    return csv


def pack_csv(csv: Path, out: Path) -> Path:
    """``shardfeed pack CSV OUT --csv-labels label --csv-mask mask``, as a user runs it."""
    code = main(["pack", str(csv), str(out), "--csv-labels", "label", "--csv-mask", "mask",
                 "--no-progress"])
    assert code == 0
    return out


def write_foreign_tfrecord(folder: Path, masks: list[bytes], *, size: int = 32) -> Path:
    """``folder/seg.tfrecord``, written record by record as another program writes
    ``tf.train.Example`` files (no shardfeed pack, so no pack-time checks), then indexed
    with ``shardfeed index`` as a user does before reading it. Image i: ``size``×``size``."""
    from shardfeed.format.example import encode_example
    from shardfeed.format.framing import frame

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "seg.tfrecord"
    with open(path, "wb") as f:
        for i, mask in enumerate(masks):
            picture = VOC[index_pattern(size, size, i)]
            f.write(frame(encode_example({
                "image/encoded": rgb_png(picture), "image/format": b"png",
                "image/filename": f"im{i}.png".encode(), "image/class/label": [i],
                "mask/encoded": mask, "mask/format": b"png",
            })))
    assert main(["index", str(folder), "--no-progress"]) == 0
    return folder
