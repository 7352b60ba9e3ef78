"""The product catalog example's prepare function (batch_assets/examples/catalog.py, docs/transforms.md): prices
written with a decimal point or a decimal comma become one float column; a price that is neither is that row's error
with the reason (and the value); a missing price is no error; rows, their order and row_id are untouched."""

from __future__ import annotations

import pyarrow as pa

from batch_assets.examples.catalog import parse_prices


def test_prices_either_way_become_floats_and_unreadable_ones_are_row_errors() -> None:
    batch = pa.RecordBatch.from_pydict({
        "row_id": ["a", "b", "c", "d", "e", "f"],
        "price": ["12.99", "12,99", " 7 ", None, "about 5", "1.234,56"],
    })
    out = parse_prices(batch)
    assert out.num_rows == batch.num_rows and out.column("row_id").to_pylist() == ["a", "b", "c", "d", "e", "f"]
    assert out.column("price").to_pylist() == batch.column("price").to_pylist(), "the source column is kept as is"
    assert out.schema.field("price_eur").type == pa.float64()
    assert out.column("price_eur").to_pylist() == [12.99, 12.99, 7.0, None, None, None]
    assert out.column("_row_error").to_pylist() == [None, None, None, None, "price is not a number: about 5",
                                                    "price is not a number: 1.234,56"]


def test_numeric_prices_read_from_a_typed_column_pass_through() -> None:
    batch = pa.RecordBatch.from_pydict({"row_id": ["a", "b"], "price": pa.array([3.5, 10.0])})
    out = parse_prices(batch)
    assert out.column("price_eur").to_pylist() == [3.5, 10.0]
    assert out.column("_row_error").null_count == 2
