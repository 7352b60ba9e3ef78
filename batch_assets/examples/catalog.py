"""A `prepare.function` for the product catalog example (docs/transforms.md): prices written either way, '12.99'
or '12,99', become one float column, and a price that is neither is a row error with the reason.

A prepare function takes a pyarrow RecordBatch and returns one with the same rows in the same order (row_id
untouched); here it adds `price_eur` (declared in the spec's `prepare.function_columns`) and, for rows it cannot
read, the reason in a `_row_error` string column (null where the row is fine).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def parse_prices(batch: pa.RecordBatch) -> pa.RecordBatch:
    text = pc.utf8_trim_whitespace(pc.cast(batch.column("price"), pa.string()))
    dotted = pc.replace_substring(text, ",", ".")  # the decimal comma of many European shops
    readable = pc.fill_null(pc.match_substring_regex(dotted, r"^[0-9]+(\.[0-9]+)?$"), True)  # a null price is fine
    price = pc.cast(pc.if_else(readable, dotted, pa.scalar(None, pa.string())), pa.float64())
    reason = pc.if_else(readable, pa.scalar(None, pa.string()),
                        pc.binary_join_element_wise("price is not a number: ", text, ""))
    return batch.append_column("price_eur", price).append_column("_row_error", reason)
