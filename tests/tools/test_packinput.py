"""CSV reading, column ranges, folder scanning and the shard planner."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfeed.errors import PackError
from shardfeed.tools.pack.csvinput import CsvColumns, expand_columns, parse_order_key, read_csv
from shardfeed.tools.pack.items import scan_folder
from shardfeed.tools.pack.plan import parse_size, plan_shards, sort_key


def test_expand_columns_ranges() -> None:
    assert expand_columns("VF,IRR0..IRR2,MPC0..MPC1") == (
        "VF", "IRR0", "IRR1", "IRR2", "MPC0", "MPC1")
    assert expand_columns("F08..F10") == ("F08", "F09", "F10")
    assert expand_columns("X1..3") == ("X1", "X2", "X3")
    with pytest.raises(ValueError, match="counts down"):
        expand_columns("A3..A1")
    with pytest.raises(ValueError, match="twice"):
        expand_columns("A,A0..A1,A")


def test_order_keys_numbers_and_iso_in_nanoseconds() -> None:
    assert parse_order_key("12.5") == 12_500_000_000
    assert parse_order_key("1500", unit="ms") == 1_500_000_000
    assert parse_order_key("1970-01-01T00:01:00", unit="iso") == 60 * 10**9
    assert parse_order_key("1970-01-01T01:00:00+01:00", unit="iso") == 0
    assert parse_order_key("1970-01-01T00:00:08.25Z", unit="iso") == 8_250_000_000
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_order_key("noon")
    with pytest.raises(ValueError, match="int64 nanoseconds"):
        parse_order_key("1714564800000", unit="s")  # epoch ms read as seconds: year 56000


def _csv(tmp_path: Path, text: str, images: int = 2) -> Path:
    import cv2
    import numpy as np

    for i in range(images):
        _ok, data = cv2.imencode(".jpg", np.full((8, 8, 3), i, np.uint8))
        (tmp_path / f"i{i}.jpg").write_bytes(data.tobytes())
    path = tmp_path / "d.csv"
    path.write_text(text)
    return path


def test_csv_missing_column_names_csv_and_columns(tmp_path: Path) -> None:
    path = _csv(tmp_path, "path,label\ni0.jpg,1\n")
    with pytest.raises(PackError, match=r"d\.csv' has no column 'day'.*path, label"):
        read_csv(path, columns=CsvColumns(group="day"))


def test_csv_non_numeric_label_names_line_and_column(tmp_path: Path) -> None:
    path = _csv(tmp_path, "path,label\ni0.jpg,1\ni1.jpg,cat\n")
    with pytest.raises(PackError, match=r"line 3, column 'label': 'cat' is not an integer"):
        read_csv(path, columns=CsvColumns(labels=("label",)))
    path.write_text("path,a,b\ni0.jpg,1,x\n")
    with pytest.raises(PackError, match=r"line 2, column 'b': 'x' is not a number"):
        read_csv(path, columns=CsvColumns(floats=("a", "b")))


def test_csv_missing_files_all_named_with_lines(tmp_path: Path) -> None:
    from shardfeed.tools.pack import pack
    from shardfeed.tools.pack.check import BadInputsError

    path = _csv(tmp_path, "path\ni0.jpg\nnope.jpg\ni1.jpg\ngone.jpg\n")
    with pytest.raises(BadInputsError, match=r"2 input files.*line 3: '.*nope\.jpg' does not "
                       r"exist.*--root") as caught:
        pack(path, tmp_path / "out")
    assert [(p.line, Path(p.path).name) for p in caught.value.problems] == [
        (3, "nope.jpg"), (5, "gone.jpg")]
    assert not (tmp_path / "out").exists()


def test_csv_labels_floats_onehot_groups(frames_csv: Path) -> None:
    data = read_csv(frames_csv, columns=CsvColumns(
        labels=("label",), floats="VF,IRR0..IRR2", onehot=("sky",), mask="mask",
        group="day", order="timestamp"))
    assert len(data.items) == 12
    assert data.vocabularies["image/label/sky"] == ("clear", "cloudy", "rain")
    assert data.group_names == ("2024-05-01", "2024-05-02", "2024-05-03")
    for item in data.items:
        assert len(item.float_labels["labels"]) == 4
        hot = item.int_labels["image/label/sky"]
        assert sum(hot) == 1 and len(hot) == 3
        assert item.group_value == data.group_names[item.group]  # type: ignore[index]
        assert item.name.startswith("img/") and item.mask_name.startswith("mask/")  # type: ignore[union-attr]


def test_folder_scan_labels_sorted_class_index(class_folder: Path) -> None:
    data = scan_folder(class_folder)
    assert data.vocabularies["image/class/label"] == ("cat", "dog", "emu")
    labels = {it.name: it.int_labels["image/class/label"][0] for it in data.items}
    assert labels["cat/cat0.jpg"] == 0 and labels["dog/dog1.png"] == 1
    assert labels["emu/emu3.png"] == 2
    assert len(labels) == 9


def test_folder_scan_empty_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PackError, match="no images found"):
        scan_folder(tmp_path)


def test_parse_size() -> None:
    assert parse_size("64MB") == 64_000_000
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("1.5k") == 1500
    assert parse_size(" 500 ") == 500
    with pytest.raises(ValueError, match="64MB"):
        parse_size("lots")


keys_strategy = st.lists(
    st.tuples(st.integers(0, 4) | st.none(), st.integers(0, 50) | st.none()),
    min_size=0, max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(rows=keys_strategy, per=st.integers(1, 7), limit=st.integers(1, 400),
       sizes=st.lists(st.integers(1, 120), min_size=60, max_size=60))
def test_plan_groups_contiguous_sorted_and_shards_cover(
    rows: list[tuple[int | None, int | None]], per: int, limit: int, sizes: list[int]
) -> None:
    keys = [sort_key(g, None if o is None else float(o), i) for i, (g, o) in enumerate(rows)]
    for plan in (
        plan_shards(keys, sizes[:len(keys)], records_per_shard=per),
        plan_shards(keys, sizes[:len(keys)], shard_bytes=limit),
    ):
        order = plan.order
        assert sorted(order) == list(range(len(keys)))
        ordered = [keys[i] for i in order]
        assert ordered == sorted(ordered)  # groups contiguous, order keys sorted within
        starts = [s.start for s in plan.shards]
        stops = [s.stop for s in plan.shards]
        assert starts == ([0] + stops[:-1] if stops else [])
        assert (stops[-1] if stops else 0) == len(keys)
        assert all(s.records >= 1 for s in plan.shards)
    a = plan_shards(keys, sizes[:len(keys)], shard_bytes=limit, fingerprint="x")
    b = plan_shards(keys, sizes[:len(keys)], shard_bytes=limit, fingerprint="x")
    c = plan_shards(keys, sizes[:len(keys)], shard_bytes=limit, fingerprint="y")
    assert a == b and a.digest != c.digest


def test_plan_shard_bytes_respects_limit() -> None:
    keys = [sort_key(None, None, i) for i in range(10)]
    plan = plan_shards(keys, [30] * 10, shard_bytes=100)
    assert [s.records for s in plan.shards] == [3, 3, 3, 1]
    assert plan.shards[0].name == "shard-00000-of-00004.tfrecord"
    big = plan_shards(keys, [500] * 10, shard_bytes=100)
    assert [s.records for s in big.shards] == [1] * 10
