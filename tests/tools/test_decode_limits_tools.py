"""`shardfeed verify --decode` and `shardfeed pack` with decompression bombs and images a
Loader refuses: verify names them as bad records (exit 1) deciding exactly as the Loader
does; pack lists them as bad inputs and writes nothing; neither takes more than a little
memory."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from image_bombs import bmp_bomb, jpeg_bomb, peak_rss_mb, png_bomb, png_real

from shardfeed.cli.main import main
from shardfeed.dataset import Dataset
from shardfeed.errors import DecodeError
from shardfeed.format.writer import ShardWriter
from shardfeed.pipeline import Loader
from shardfeed.tools.pack import pack
from shardfeed.tools.pack.check import BadInputsError
from shardfeed.tools.verify import verify
from shardfeed.transforms import presets

BAD = 5


def _small(i: int) -> bytes:
    return bytes(simplejpeg.encode_jpeg(np.full((24, 32, 3), i * 20, np.uint8)))


def _shard(folder: Path, bad: dict[str, object], n: int = 8) -> Path:
    """``n`` records of small JPEGs; record ``BAD`` has the features ``bad`` instead."""
    folder.mkdir(parents=True)
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(n):
            features: dict[str, object] = {"image/encoded": _small(i), "index": [i]}
            writer.write_example(bad if i == BAD else features)
    return folder


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize(("image", "claim"), [
    (jpeg_bomb(30000, 30000), "JPEG image claims 30000×30000"),
    (png_bomb(60000, 60000), "PNG image claims 60000×60000"),
], ids=["jpeg", "png"])
def test_verify_reports_a_bomb_as_a_bad_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], image: bytes, claim: str
) -> None:
    folder = _shard(tmp_path / "ds", {"image/encoded": image, "index": [BAD]})
    path, record, offset = Dataset(str(folder)).locate(BAD)
    code, out = _run(["verify", str(folder), "--decode", "--no-progress"], capsys)
    assert code == 1
    assert claim in out and f"record {record}" in out and "--max-pixels" in out
    code, out = _run(["verify", str(folder), "--decode", "--json", "--no-progress"], capsys)
    [problem] = json.loads(out)["problems"]
    assert (problem["path"], problem["record"], problem["offset"]) == (path, record, offset)
    assert problem["kind"] == "undecodable image" and claim in problem["detail"]


def test_verify_of_bombs_stays_small(tmp_path: Path) -> None:
    """`verify --decode` took 2.7 GB on one 30000×30000 JPEG bomb, a MemoryError at 60000."""
    folder = tmp_path / "ds"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for image in (jpeg_bomb(30000, 30000), jpeg_bomb(60000, 60000), png_real(12000, 12000)):
            writer.write_example({"image/encoded": image})
    peak, result = peak_rss_mb("""
        from shardfeed.tools.verify import verify
        report = verify(ARGS["folder"], decode=True)
        RESULT["kinds"] = [p.kind for p in report.problems]
    """, folder=str(folder))
    assert result["kinds"] == ["undecodable image"] * 3
    assert peak < 300


def test_verify_takes_the_loaders_limit(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = _shard(tmp_path / "ds", {"image/encoded": _small(BAD), "index": [BAD]})
    code, out = _run(["verify", str(folder), "--decode", "--max-pixels", "767",
                      "--no-progress"], capsys)
    assert code == 1 and out.count("more than max_pixels=767") == 8
    assert _run(["verify", str(folder), "--decode", "--max-pixels", "768", "--no-progress"],
                capsys)[0] == 0
    assert verify(str(folder), decode=True, max_pixels=768).ok
    with pytest.raises(ValueError, match="max_pixels must be >= 1"):
        verify(str(folder), decode=True, max_pixels=0)


def test_verify_refuses_the_float_tiff_a_loader_refuses(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    ok, tiff = cv2.imencode(".tiff", np.random.default_rng(0).random((24, 32, 3),
                                                                     dtype=np.float32))
    assert ok
    folder = _shard(tmp_path / "ds", {"image/encoded": tiff.tobytes(), "index": [BAD]})
    with pytest.raises(DecodeError, match="32 bits"):
        list(Loader(Dataset(str(folder)), batch_size=4, shuffle=False,
                    transform=presets.eval(size=16)))
    code, out = _run(["verify", str(folder), "--decode", "--no-progress"], capsys)
    assert code == 1 and "32 bits" in out and f"record {BAD}" in out


def test_verify_reads_raw_pixels_as_the_loader_does(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    with ShardWriter(str(folder / "part-0.tfrecord")) as writer:
        for i in range(4):
            h, w = (50000, 50000) if i == 1 else (4, 6)
            writer.write_example({"image/raw": bytes(4 * 6 * 3), "image/height": [h],
                                  "image/width": [w], "image/channels": [3]})
    code, out = _run(["verify", str(folder), "--decode", "--no-progress"], capsys)
    assert code == 1 and "raw image claims 50000×50000" in out and "record 1" in out
    with pytest.raises(DecodeError, match="raw image claims 50000×50000"):
        list(Loader(Dataset(str(folder)), batch_size=2, shuffle=False,
                    transform=presets.eval(size=4)))


def _photos(folder: Path, bombs: dict[str, bytes]) -> Path:
    for i in range(4):
        path = folder / ("cats" if i % 2 else "dogs") / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_small(i))
    for name, data in bombs.items():
        (folder / "cats" / name).write_bytes(data)
    return folder


BOMBS = {"bomb.jpg": jpeg_bomb(30000, 30000), "bomb.png": png_bomb(60000, 60000),
         "bomb.bmp": bmp_bomb(20000, 20000)}


def test_pack_lists_bombs_and_writes_nothing(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    source = _photos(tmp_path / "photos", BOMBS)
    out = tmp_path / "out"
    with pytest.raises(BadInputsError, match="3 input files") as caught:
        pack(source, out)
    found = {Path(p.path).name: p.problem for p in caught.value.problems}
    assert set(found) == set(BOMBS)
    assert "claims 30000x30000 (height x width) = 900,000,000 pixels" in found["bomb.jpg"]
    assert "claims 60000x60000" in found["bomb.png"] and "claims 20000x20000" in found["bomb.bmp"]
    assert all("more than max_pixels=134,217,728" in p and "--max-pixels" in p
               for p in found.values())
    assert not out.exists()
    code, text = _run(["pack", str(source), str(out), "--no-progress"], capsys)
    assert code == 1 and "bomb.jpg" in text and "claims 30000x30000" in text
    assert not out.exists()


def test_pack_skip_bad_leaves_bombs_out(tmp_path: Path) -> None:
    source = _photos(tmp_path / "photos", BOMBS)
    result = pack(source, tmp_path / "out", skip_bad=True)
    assert result.records == 4 and len(result.skipped) == 3


def test_pack_takes_a_raised_limit(tmp_path: Path) -> None:
    source = _photos(tmp_path / "photos", {})
    with pytest.raises(BadInputsError, match="more than max_pixels=767"):
        pack(source, tmp_path / "a", max_pixels=767)
    assert pack(source, tmp_path / "b", max_pixels=768).records == 4
    assert pack(source, tmp_path / "c", mode="raw", max_pixels=768).records == 4


def test_pack_of_bombs_stays_small(tmp_path: Path) -> None:
    source = _photos(tmp_path / "photos", {"big.png": png_real(12000, 12000), **BOMBS})
    peak, result = peak_rss_mb("""
        from shardfeed.tools.pack import pack
        from shardfeed.tools.pack.check import BadInputsError
        try:
            pack(ARGS["source"], ARGS["out"], check="decode")
        except BadInputsError as exc:
            RESULT["bad"] = sorted(p.path.rsplit("/", 1)[-1] for p in exc.problems)
    """, source=str(source), out=str(tmp_path / "out"))
    assert result["bad"] == sorted(["big.png", *BOMBS])
    assert peak < 300


def test_a_tiff_whose_directory_lies_past_the_head_is_sized(tmp_path: Path) -> None:
    """pack reads the first 256 kB of a file; a TIFF's directory may come after its pixels."""
    pixels = np.zeros((300, 400, 3), np.uint8)
    ok, tiff = cv2.imencode(".tiff", pixels, [cv2.IMWRITE_TIFF_COMPRESSION, 1])
    assert ok
    data = tiff.tobytes()
    assert struct.unpack_from("<I", data, 4)[0] > 256 << 10  # the directory follows the pixels
    source = _photos(tmp_path / "photos", {"wide.tiff": data})
    with pytest.raises(BadInputsError, match="claims 300x400"):
        pack(source, tmp_path / "out", max_pixels=100_000)
    assert pack(source, tmp_path / "out").records == 5
