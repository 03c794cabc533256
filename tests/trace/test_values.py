"""trace/values.py: the full-values side file drift's re-recording keeps (round trip, the cap, cut files refused)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from detaudit.errors import TraceError
from detaudit.trace.values import ValuesKey, ValuesWriter, read_values, values_path

KEY = ValuesKey(1, "param", "0.bias", 0, 0)


def written(path: Path, cap: int = 1 << 20) -> Path:
    writer = ValuesWriter(path, cap)
    writer.add(KEY, "float32", [2, 2], np.array([1.5, -2.0, 3.25, 0.0], "<f4").tobytes())
    # bfloat16 1.0 and -2.0, as their bits
    writer.add(ValuesKey(1, "grad", "0.bias", 1, 0), "bfloat16", [2], struct.pack("<2H", 0x3F80, 0xC000))
    writer.close()
    return path


def test_the_elements_read_back_as_written(tmp_path: Path) -> None:
    kept = read_values(written(tmp_path / "a-0.values"))
    assert kept[KEY].as_float64().tolist() == [1.5, -2.0, 3.25, 0.0]  # type: ignore[union-attr]


def test_bfloat16_elements_are_widened_from_their_bits(tmp_path: Path) -> None:
    kept = read_values(written(tmp_path / "a-0.values"))
    assert kept[ValuesKey(1, "grad", "0.bias", 1, 0)].as_float64().tolist() == [1.0, -2.0]  # type: ignore[union-attr]


def test_a_record_over_the_cap_is_kept_as_skipped_with_why(tmp_path: Path) -> None:
    kept = read_values(written(tmp_path / "a-0.values", cap=8))
    assert (kept[KEY].data, kept[KEY].head.skipped) == (
        None, "its 16 bytes of elements would exceed the side file's cap of 8 bytes per run")


def test_a_dtype_without_numbers_is_skipped_with_why(tmp_path: Path) -> None:
    writer = ValuesWriter(tmp_path / "a-0.values")
    writer.add(KEY, "complex64", [1], b"\0" * 8)
    writer.close()
    assert read_values(tmp_path / "a-0.values")[KEY].head.skipped == \
        "its dtype complex64 has no elements this reader widens to numbers"


@pytest.mark.parametrize("cut", [1, 12, 40, 80])
def test_a_file_cut_short_is_refused(tmp_path: Path, cut: int) -> None:
    path = written(tmp_path / "a-0.values")
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(TraceError, match="cut short"):
        read_values(path)


def test_a_file_whose_writer_never_closed_it_is_refused(tmp_path: Path) -> None:
    writer = ValuesWriter(tmp_path / "a-0.values")
    writer.add(KEY, "float32", [1], b"\0" * 4)  # killed here: no end frame
    writer._fh.close()
    with pytest.raises(TraceError, match="without its end frame"):
        read_values(tmp_path / "a-0.values")


def test_a_frame_whose_bytes_are_not_its_shape_s_is_refused(tmp_path: Path) -> None:
    writer = ValuesWriter(tmp_path / "a-0.values")
    writer.add(KEY, "float32", [3], b"\0" * 4)
    writer.close()
    with pytest.raises(TraceError, match="holds 4 bytes, its float32\\[3\\] needs 12"):
        read_values(tmp_path / "a-0.values")


def test_another_file_is_refused_by_its_magic(tmp_path: Path) -> None:
    (tmp_path / "x.values").write_bytes(b"\x89DTRACE\n" + b"\0" * 16)
    with pytest.raises(TraceError, match="not a detaudit full-values file"):
        read_values(tmp_path / "x.values")


def test_a_rank_s_side_file_lies_beside_its_trace() -> None:
    assert values_path(Path("run/b-0.rank-1.trace")) == Path("run/b-0.rank-1.values")
