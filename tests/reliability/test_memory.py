"""Memory does not grow with the partition: the counted structures, and peak RSS at 10x the rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from batch_assets.reliability.row_ids import RowIdFingerprint, UniqueIdChecker

ROOT = Path(__file__).resolve().parents[2]
INITIAL = UniqueIdChecker().nbytes  # 512 KB: the array's first allocation


def _batches(rows: int, size: int = 4096):
    for start in range(0, rows, size):
        n = min(size, rows - start)
        yield pa.record_batch({"row_id": [f"id-{i}" for i in range(start, start + n)],
                               "_source_file": ["f"] * n, "_source_row": list(range(start + 1, start + n + 1))})


@pytest.mark.parametrize("rows", [10_000, 100_000, 300_000])
def test_uniqueness_check_holds_at_most_16_bytes_a_row(rows: int) -> None:
    checker = UniqueIdChecker()
    for batch in _batches(rows):
        checker.add(batch)
    assert len(checker) == rows
    assert checker.nbytes <= max(INITIAL, 16 * rows)  # a Python set of ints: ~70-90 bytes a row
    assert checker.duplicates(lambda: _batches(rows)) == []


def test_exactly_once_fingerprint_keeps_no_per_row_state() -> None:
    small, large = RowIdFingerprint(), RowIdFingerprint()
    for batch in _batches(1_000):
        small.add(batch)
    for batch in _batches(100_000):
        large.add(batch)
    assert sys.getsizeof(large.__dict__) == sys.getsizeof(small.__dict__)
    assert {type(v) for v in large.__dict__.values()} == {int}
    assert all(v < 2**64 for v in large.__dict__.values())


@pytest.mark.slow
def test_peak_rss_at_10x_the_rows_is_within_1_2x() -> None:
    sys.path.insert(0, str(ROOT))
    from bench.memory_rss import compare

    small, large = compare(rows=5_000, factor=10)
    assert large["write_rows"] == 50_000 and small["write_rows"] == 5_000
    ratio = large["write_rss_mb"] / small["write_rss_mb"]  # the process's peak over all four stages
    assert ratio <= 1.2, (small, large)
