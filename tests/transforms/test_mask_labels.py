"""Masks are label maps: a user packs segmentation masks with `shardfeed pack` and loads them.

Palette PNGs keep their indices, grey masks their values; colour masks need a colour → id
mapping, 16-bit masks mask_dtype="uint16"; nothing becomes a grey level quietly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mask_files import (
    IDS,
    VOC,
    VOC_COLORS,
    grey16_png,
    index_pattern,
    pack_csv,
    palette_png,
    rgb_png,
    write_seg_csv,
)

import shardfeed
from shardfeed import Dataset, Loader
from shardfeed.errors import DecodeError
from shardfeed.transforms import DecodeImage, presets

COUNT, SIZE = 4, 32
LABEL = "image/class/label"  # the label column, under its standard name


def labels_of(i: int) -> np.ndarray:
    return index_pattern(SIZE, SIZE, i)


def load_all(ds: Dataset, transform: object) -> dict[str, np.ndarray]:
    """Every sample, in stored order, as one batch."""
    loader = Loader(ds, batch_size=COUNT, shuffle=False, transform=transform, num_threads=2)
    batches = list(loader)
    assert len(batches) == 1
    return batches[0]


@pytest.fixture
def palette_ds(tmp_path: Path) -> Dataset:
    masks = [palette_png(labels_of(i)) for i in range(COUNT)]
    return Dataset(str(pack_csv(write_seg_csv(tmp_path / "src", masks), tmp_path / "out")))


@pytest.fixture
def rgb_ds(tmp_path: Path) -> Dataset:
    masks = [rgb_png(VOC[labels_of(i)]) for i in range(COUNT)]
    return Dataset(str(pack_csv(write_seg_csv(tmp_path / "src", masks), tmp_path / "out")))


def test_palette_masks_keep_their_indices_with_decode_image(palette_ds: Dataset) -> None:
    batch = load_all(palette_ds, DecodeImage())
    assert batch["mask"].dtype == np.uint8 and batch["mask"].shape == (COUNT, SIZE, SIZE)
    assert set(np.unique(batch["mask"]).tolist()) == set(IDS)  # not {0, 38, 75, 220}
    for label, mask, image in zip(batch[LABEL], batch["mask"], batch["image"]):
        assert np.array_equal(mask, labels_of(int(label)))  # every pixel where it was
        assert np.array_equal(VOC[mask], image)  # and aligned with its image


def test_palette_masks_keep_their_indices_with_the_presets(palette_ds: Dataset) -> None:
    evaluated = load_all(palette_ds, presets.eval(size=SIZE, crop_fraction=1.0))
    for label, mask in zip(evaluated[LABEL], evaluated["mask"]):
        assert np.array_equal(mask, labels_of(int(label)))

    # The whole image as the random box, so that the flip is the only change: the mask is
    # the label map, flipped exactly when its image is.
    whole = presets.train(size=SIZE, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    flipped = 0
    for seed in range(3):
        loader = Loader(palette_ds, batch_size=COUNT, shuffle=True, seed=seed, transform=whole)
        for batch in loader:
            for label, mask, image in zip(batch[LABEL], batch["mask"], batch["image"]):
                expected = labels_of(int(label))
                if not np.array_equal(mask, expected):
                    expected = expected[:, ::-1]
                    flipped += 1
                assert np.array_equal(mask, expected)
                assert np.array_equal(VOC[mask], image)
    assert flipped > 0

    cropped = load_all(palette_ds, presets.train(size=16))  # random crops, resized
    assert set(np.unique(cropped["mask"]).tolist()) <= set(IDS)


def test_colour_mask_is_an_error_naming_the_record(rgb_ds: Dataset) -> None:
    path, record, offset = rgb_ds.locate(0)
    for transform in (DecodeImage(), presets.train(size=16), presets.eval(size=16)):
        loader = Loader(rgb_ds, batch_size=COUNT, shuffle=False, transform=transform)
        with pytest.raises(DecodeError) as info:
            next(iter(loader))
        message = str(info.value)
        assert (info.value.path, info.value.record, info.value.offset) == (path, record, offset)
        assert Path(path).name in message and f"record {record}" in message
        assert "im0.png" in message and "colour (RGB)" in message and "mask_colors" in message


def test_colour_mask_with_a_mapping_gives_ids(rgb_ds: Dataset) -> None:
    batch = load_all(rgb_ds, DecodeImage(mask_colors=VOC_COLORS))
    for label, mask in zip(batch[LABEL], batch["mask"]):
        assert np.array_equal(mask, labels_of(int(label)))
    evaluated = load_all(rgb_ds, presets.eval(size=SIZE, crop_fraction=1.0,
                                              mask_colors=VOC_COLORS))
    for label, mask in zip(evaluated[LABEL], evaluated["mask"]):
        assert np.array_equal(mask, labels_of(int(label)))


def test_unlisted_colours_are_an_error_or_the_stated_id(rgb_ds: Dataset) -> None:
    partial = {color: i for color, i in VOC_COLORS.items() if i != 2}
    with pytest.raises(DecodeError, match=r"does not list: \(0, 128, 0\)"):
        load_all(rgb_ds, DecodeImage(mask_colors=partial))
    batch = load_all(rgb_ds, DecodeImage(mask_colors=partial, mask_unlisted=200))
    for label, mask in zip(batch[LABEL], batch["mask"]):
        expected = labels_of(int(label)).copy()
        expected[expected == 2] = 200
        assert np.array_equal(mask, expected)


def test_a_mapping_also_names_palette_colours(palette_ds: Dataset) -> None:
    renumbered = {color: {0: 0, 1: 10, 2: 20, 255: 255}[i] for color, i in VOC_COLORS.items()}
    batch = load_all(palette_ds, DecodeImage(mask_colors=renumbered))
    for label, mask in zip(batch[LABEL], batch["mask"]):
        expected = labels_of(int(label)).copy()
        expected[expected == 1], expected[expected == 2] = 10, 20
        assert np.array_equal(mask, expected)


def test_sixteen_bit_masks_error_or_keep_their_values(tmp_path: Path) -> None:
    # ids 0, 301, 302, 555: an 8-bit cut would give 0, 1, 1, 2 (or 0, 1, 1, 2 >> 8 = 0)
    values = [np.where(labels_of(i) > 0, labels_of(i).astype(np.uint16) + 300, 0).astype(np.uint16)
              for i in range(COUNT)]
    ds = Dataset(str(pack_csv(write_seg_csv(tmp_path / "src", [grey16_png(v) for v in values]),
                              tmp_path / "out")))
    with pytest.raises(DecodeError, match="mask_dtype='uint16'"):
        load_all(ds, DecodeImage())  # never cut to 8 bits
    op = DecodeImage(mask_dtype="uint16")
    batch = load_all(ds, op)
    assert batch["mask"].dtype == np.uint16
    for label, mask in zip(batch[LABEL], batch["mask"]):
        assert np.array_equal(mask, values[int(label)])
    assert op.bind(ds.schema, root=ds.root).output_spec({})["mask"].dtype == np.uint16
    cropped = load_all(ds, presets.eval(size=SIZE, crop_fraction=1.0, mask_dtype="uint16"))
    for label, mask in zip(cropped[LABEL], cropped["mask"]):
        assert np.array_equal(mask, values[int(label)])


def test_grey_masks_keep_their_values(tmp_path: Path) -> None:
    import cv2

    grey = [labels_of(i) for i in range(COUNT)]
    files = [cv2.imencode(".png", grey[0])[1].tobytes(),  # 8-bit grey
             cv2.imencode(".png", np.repeat(grey[1][:, :, None], 3, axis=2))[1].tobytes(),  # R=G=B
             palette_png(np.minimum(grey[2], 3), bits=2),  # 2-bit palette
             palette_png(grey[3], transparency=0)]  # with a tRNS chunk
    ds = Dataset(str(pack_csv(write_seg_csv(tmp_path / "src", files), tmp_path / "out")))
    batch = load_all(ds, DecodeImage())
    expected = [grey[0], grey[1], np.minimum(grey[2], 3), grey[3]]
    for label, mask in zip(batch[LABEL], batch["mask"]):
        assert np.array_equal(mask, expected[int(label)])


def test_mask_options_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="r, g, b"):
        DecodeImage(mask_colors={(128, 0): 1})
    with pytest.raises(ValueError, match="0..255"):
        presets.train(mask_colors={(128, 0, 0): 300})
    with pytest.raises(ValueError, match="needs mask_colors"):
        presets.eval(mask_unlisted=255)
    with pytest.raises(ValueError, match="mask_dtype"):
        DecodeImage(mask_dtype="int8")  # type: ignore[arg-type]
    assert shardfeed.transforms.DecodeImage(mask_colors={(1, 2, 3): 300}, mask_dtype="uint16")


def test_raw_mode_stores_palette_indices_and_refuses_colour_masks(tmp_path: Path) -> None:
    from shardfeed.cli.main import main

    masks = [palette_png(labels_of(i)) for i in range(COUNT)]
    csv = write_seg_csv(tmp_path / "src", masks)
    out = tmp_path / "raw"
    assert main(["pack", str(csv), str(out), "--csv-labels", "label", "--csv-mask", "mask",
                 "--mode", "raw", "--no-progress"]) == 0
    batch = load_all(Dataset(str(out)), DecodeImage())
    for label, mask in zip(batch[LABEL], batch["mask"]):
        assert np.array_equal(mask, labels_of(int(label)))  # indices, not grey levels

    rgb = write_seg_csv(tmp_path / "rgb", [rgb_png(VOC[labels_of(i)]) for i in range(COUNT)])
    code = main(["pack", str(rgb), str(tmp_path / "rgb-out"), "--csv-labels", "label",
                 "--csv-mask", "mask", "--mode", "raw", "--no-progress"])
    assert code == 1 and not (tmp_path / "rgb-out" / "shardfeed.json").exists()
