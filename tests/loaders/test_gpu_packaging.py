"""What a user is told to install for decoding on the GPU: the wheels of the installed torch's
CUDA (``torch.version.cuda``, faked here), and, where nvImageCodec found no libnvjpeg, the
nvJPEG wheel or the folder to name in ``LD_LIBRARY_PATH``. No GPU needed: every message is
chosen before a decoder is made."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from shardfeed.loaders.torch_decode import DeviceDecode, plan_of
from shardfeed.transforms import presets
from shardfeed.transforms.decode import region
from shardfeed.transforms.decode.region import Libraries

CU12_WHEELS = ("nvimgcodec-cu12", "nvidia-nvimgcodec-cu12", "nvidia-nvjpeg-cu12")
CU13_WHEELS = ("nvimgcodec-cu13", "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg 13")


def _device_decode_error(monkeypatch: pytest.MonkeyPatch, torch_cuda: str | None, *,
                         module: Any, found: Libraries | None) -> str:
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setattr(region, "backend", lambda: module)
    monkeypatch.setattr(region, "libraries", lambda: found)
    plan = plan_of(presets.train(size=32, decode_on="cuda"))
    assert plan is not None
    with pytest.raises(ValueError) as caught:
        DeviceDecode(plan, torch.device("cuda"))
    return str(caught.value)


@pytest.mark.parametrize(("torch_cuda", "named", "not_named"), [
    ("12.8", CU12_WHEELS, CU13_WHEELS),
    ("12.1", CU12_WHEELS, CU13_WHEELS),
    ("13.0", CU13_WHEELS, CU12_WHEELS),
    ("13.2", CU13_WHEELS, CU12_WHEELS),
])
def test_no_nvimgcodec_names_the_wheels_of_torchs_cuda(
        monkeypatch: pytest.MonkeyPatch, torch_cuda: str, named: tuple[str, ...],
        not_named: tuple[str, ...]) -> None:
    message = _device_decode_error(monkeypatch, torch_cuda, module=None, found=None)
    for wheel in named:
        assert wheel in message
    for wheel in not_named:
        assert wheel not in message
    assert f"torch's CUDA {torch_cuda}" in message
    assert "decode_on='cpu'" in message


@pytest.mark.parametrize("torch_cuda", [None, "11.8"])
def test_no_nvimgcodec_without_a_cuda_torch_names_both(monkeypatch: pytest.MonkeyPatch,
                                                       torch_cuda: str | None) -> None:
    message = _device_decode_error(monkeypatch, torch_cuda, module=None, found=None)
    for wheel in CU12_WHEELS + CU13_WHEELS:
        assert wheel in message
    assert ("torch has no CUDA" if torch_cuda is None else "neither 12 nor 13") in message


def test_nvjpeg_missing_for_cuda_13_names_its_wheel_and_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = Libraries(cuda_major=13, nvjpeg_path=None, nvjpeg_loaded=False)
    message = _device_decode_error(monkeypatch, "13.0", module=SimpleNamespace(), found=found)
    assert "nvJPEG" in message
    assert "pip install 'nvidia-nvjpeg>=13,<14'" in message
    assert "LD_LIBRARY_PATH" in message and "nvidia/cu13/lib" in message
    assert "cu12" not in message


def test_nvjpeg_missing_for_cuda_12_names_its_wheel_and_folder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = Libraries(cuda_major=12, nvjpeg_path=None, nvjpeg_loaded=False)
    message = _device_decode_error(monkeypatch, "12.6", module=SimpleNamespace(), found=found)
    assert "pip install nvidia-nvjpeg-cu12" in message
    assert "nvidia/nvjpeg/lib" in message
    assert "cu13" not in message


def test_nvimgcodec_of_another_cuda_than_torch_names_the_swap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = Libraries(cuda_major=12, nvjpeg_path=None, nvjpeg_loaded=False)
    message = _device_decode_error(monkeypatch, "13.0", module=SimpleNamespace(), found=found)
    assert "pip uninstall nvidia-nvimgcodec-cu12" in message
    assert "shardfeed[nvimgcodec-cu13]" in message


def test_nvjpeg_found_raises_nothing_about_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nvJPEG loaded the constructor goes on to make the decoder (here a fake that
    refuses, so that no GPU is touched): the refusal is the decoder's, not a message."""

    class Refuses:
        NVIMGCODEC_DEVICE_CPU_ONLY = -1

        def Decoder(self, **_: Any) -> Any:  # nvImageCodec spells it so
            raise RuntimeError("the fake decoder")

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(region, "backend", lambda: Refuses())
    monkeypatch.setattr(region, "libraries",
                        lambda: Libraries(cuda_major=13, nvjpeg_path=None, nvjpeg_loaded=True))
    plan = plan_of(presets.train(size=32, decode_on="cuda"))
    assert plan is not None
    with pytest.raises(RuntimeError, match="the fake decoder"):
        DeviceDecode(plan, torch.device("cuda"))


def test_the_cpu_device_needs_no_nvjpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device half on nvImageCodec's CPU backend (the tests' path) does not ask for it."""
    if region.backend() is None:
        pytest.skip("nvImageCodec (shardfeed[nvimgcodec]) is not installed")
    monkeypatch.setattr(region, "libraries",
                        lambda: Libraries(cuda_major=12, nvjpeg_path=None, nvjpeg_loaded=False))
    plan = plan_of(presets.train(size=32, decode_on="cuda"))
    assert plan is not None
    assert DeviceDecode(plan, torch.device("cpu")).stream is None


def _fake_site(root: Path, folder: str, name: str) -> Path:
    path = root / folder / name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    return path


def test_the_nvjpeg_wheel_is_found_on_sys_path_where_the_system_has_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """libnvjpeg.so.13 under another sys.path entry's nvidia/cu13/lib (a wheel installed with
    --target, or in another site-packages) is loaded from there; the CUDA 12 folder of the
    same entry is not taken for CUDA 13."""
    other = _fake_site(tmp_path / "a", "nvidia/nvjpeg/lib", "libnvjpeg.so.12")
    wanted = _fake_site(tmp_path / "b", "nvidia/cu13/lib", "libnvjpeg.so.13")
    tried: list[str] = []

    def loads(name: str) -> bool:
        tried.append(name)
        return os.path.isfile(name)  # the system finds nothing by name

    monkeypatch.setattr(region, "_loads", loads)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert region._preload_nvjpeg(13) == str(wanted)
    assert tried[0] == "libnvjpeg.so.13"
    assert str(other) not in tried
    assert region._preload_nvjpeg(12) == str(other)


def test_the_systems_nvjpeg_is_left_to_the_system(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """Where LD_LIBRARY_PATH or the loader's cache finds libnvjpeg by name, no wheel folder is
    loaded: nvImageCodec takes the one the user named."""
    _fake_site(tmp_path, "nvidia/cu13/lib", "libnvjpeg.so.13")
    tried: list[str] = []

    def loads(name: str) -> bool:
        tried.append(name)
        return True

    monkeypatch.setattr(region, "_loads", loads)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert region._preload_nvjpeg(13) is None
    assert tried == ["libnvjpeg.so.13"]


def test_loading_reports_what_it_found() -> None:
    """On this machine's install: the wheel's CUDA is read from its metadata, and nvJPEG is
    reported loaded exactly when its library can be opened by name or was loaded here."""
    if region.backend() is None:
        pytest.skip("nvImageCodec (shardfeed[nvimgcodec]) is not installed")
    found = region.libraries()
    assert found is not None
    assert found.cuda_major in (12, 13)
    module = region.backend()
    assert int(module.__cuda_version__) // 1000 == found.cuda_major  # type: ignore[union-attr]
    if found.nvjpeg_path is not None:
        assert found.nvjpeg_loaded
    assert found.nvjpeg_loaded == region._loads(f"libnvjpeg.so.{found.cuda_major}")
