"""Image columns in the prepare stage: fetched, decoded and resized here, never in the request loop."""

from __future__ import annotations

import pyarrow as pa

from batch_assets.spec_sections import PipelineSections
from batch_assets.resources.multimodal import prepare_images as prepare_column


def prepare_images(spec: PipelineSections, batch: pa.RecordBatch) -> tuple[pa.Array, list[str | None]]:
    """(list<binary> column of encoded images per row, per-row problem or None)."""
    n = batch.num_rows
    per_row: list[list[bytes]] = [[] for _ in range(n)]
    problems: list[str | None] = [None] * n
    for column in spec.prepare.image_columns:
        prepared = prepare_column(batch.column(column).to_pylist(), spec.prepare.image_max_side)
        for i, image in enumerate(prepared):
            if image.ok and image.data is not None:
                per_row[i].append(image.data)
            elif problems[i] is None:
                problems[i] = f"image in column {column!r} could not be used: {image.error}"
    return pa.array(per_row, pa.list_(pa.binary())), problems
