"""What a stage reports per partition (stages/report.py), as the UI shows it: row counts, the rate, the error rate
the blocking check compares, run totals that cannot be mistaken for one partition's, and a preview table that a
cell's text cannot break."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from batch_assets.stages.report import (
    PartitionReport,
    counter_delta,
    error_fraction,
    markdown_preview,
    partition_metadata,
    preview_of,
    run_totals,
)


def _value(md: dict, key: str):
    return md[key].value


def test_a_partition_s_metadata_has_its_counts_rate_path_columns_and_errors() -> None:
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), ("embedding", pa.list_(pa.float32(), 3))])
    report = PartitionReport("p1", rows_in=120, rows_out=100, seconds=4.0, path="/data/out/p1.parquet",
                             extra={"model_errors": 5, "tokens": 321, "cost_usd": 0.25, "model": "m",
                                    "trial": True, "already": dg.MetadataValue.url("http://x")},
                             rows_with_errors=7, schema=schema, preview="| id |")
    md = partition_metadata(report)
    assert _value(md, "dagster/row_count") == 100 and _value(md, "rows_in") == 120
    assert _value(md, "rows_per_s") == 25.0 and _value(md, "path") == "/data/out/p1.parquet"
    assert _value(md, "rows_with_errors") == 7
    assert _value(md, "error_rate") == 0.05  # the model's failures only: the check's figure, not 7 / 100
    assert isinstance(md["tokens"], dg.IntMetadataValue) and isinstance(md["cost_usd"], dg.FloatMetadataValue)
    assert isinstance(md["trial"], dg.BoolMetadataValue) and _value(md, "model") == "m"
    assert md["already"] == dg.MetadataValue.url("http://x")
    columns = md["dagster/column_schema"].columns
    assert [(c.name, c.type) for c in columns] == [("id", "string"), ("embedding", "fixed_size_list<item: float>[3]")]
    assert columns[0].constraints.nullable is False
    assert _value(md, "preview") == "| id |"


def test_an_empty_or_instant_partition_has_a_zero_rate_and_error_rate() -> None:
    md = partition_metadata(PartitionReport("p", rows_out=0, seconds=0.0, rows_with_errors=0))
    assert _value(md, "rows_per_s") == 0.0 and _value(md, "error_rate") == 0.0
    assert error_fraction(PartitionReport("p", rows_out=10, extra={"rows_with_errors": 2})) == 0.2


def test_run_totals_only_for_several_partitions_named_as_the_run_s() -> None:
    assert run_totals([PartitionReport("a", rows_out=3)]) == {}
    reports = [PartitionReport(f"k{i}", rows_out=i, seconds=1.0, path=f"s3://b/out/k{i}.parquet") for i in range(10)]
    totals = run_totals(reports)
    assert _value(totals, "run_partitions") == 10 and _value(totals, "run_rows_out") == 45
    assert _value(totals, "run_partition_keys") == "k0, k1, k2, k3, k4, k5, k6, k7, … (10 in all)"
    assert _value(totals, "run_output_folder") == "s3://b/out"
    assert all(key.startswith("run_") for key in totals)
    assert "run_output_folder" not in run_totals([PartitionReport("a", path="/x/a.parquet"),
                                                  PartitionReport("b", path="/y/b.parquet")])


def test_counter_delta_is_each_int_counter_s_growth() -> None:
    @dataclass
    class Stats:
        rows: int = 0
        tokens: int = 0
        label: str = ""

    assert counter_delta(Stats(10, 500, "b"), Stats(4, 200, "a")) == {"rows": 6, "tokens": 300}


def test_the_preview_is_one_table_whatever_the_cells_hold() -> None:
    batch = pa.RecordBatch.from_pylist([
        {"id": "a|b", "text": "line one\nline two", "vec": [0.12345, 1.0, 2.0, 3.0], "raw": b"12345", "n": None},
        {"id": "c", "text": "x" * 100, "vec": [], "raw": None, "n": 0.5},
    ])
    lines = markdown_preview([batch], ["id", "text", "vec", "raw", "n"]).splitlines()
    assert len(lines) == 4 and all(line.startswith("| ") for line in lines[2:])
    assert lines[2] == r"| a\|b | line one line two | [0.123, 1.000, 2.000, … 4 values] | <5 bytes> |  |"
    assert lines[3].startswith("| c | " + "x" * 57 + "… |") and lines[3].endswith("| 0.500 |")
    assert markdown_preview([], ["id"]) == "_no rows_"


def test_preview_of_a_written_file_shows_its_first_rows_and_only_columns_it_has(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(100)], "label": ["x"] * 100}), path)
    lines = preview_of(str(path), ["id", "missing", "label"], rows=3).splitlines()
    assert lines[0] == "| id | label |" and len(lines) == 5 and lines[-1] == "| r2 | x |"
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), path)
    assert preview_of(str(path), ["id"]) == "_no rows_"
