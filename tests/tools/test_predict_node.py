"""bench/predict_node.py: a perf sample goes to the side of the first library on its stack
that holds or releases the GIL, and the prediction is the lower of the two bounds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _module():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("predict_node", BENCH / "predict_node.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_samples_go_to_the_library_that_decides() -> None:
    classify = _module().classify
    # a JPEG decode called from Python: the decoder releases the GIL
    assert classify(["libc.so.6", "_jpeg.cpython-311-x86_64-linux-gnu.so",
                     "libpython3.11.so.1.0"]) == "released"
    # memcpy under NumPy: held
    assert classify(["libc.so.6", "_multiarray_umath.cpython-311.so",
                     "libpython3.11.so.1.0"]) == "held"
    assert classify(["libpython3.11.so.1.0"]) == "held"
    assert classify(["libz.so.1.2.13", "_slice.cpython-311.so"]) == "released"
    # a C-library sample whose caller cannot be told is kept apart
    assert classify(["libc.so.6"]) == "libc"
    assert classify(["[kernel.kallsyms]"]) == "other"


def test_the_node_constants_match_the_readme() -> None:
    module = _module()
    readme = (BENCH.parent / "README.md").read_text()
    assert "596 / 7,510" in readme  # the full decode, 1 / 16 threads, the predictor's eff
    for figure in module.NODE_SEEN.values():
        assert f"{figure:,.0f}" in readme
    assert 0 < module.U <= 1
