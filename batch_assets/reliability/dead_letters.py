"""Dead letters: the rows of a partition that failed, kept where a user can see them and retry them.

The write stage publishes, beside the output, `<storage root>/<pipeline>/dead_letters/<partition>.parquet`: one row
per failed row with its id, origin, error class, message, raw model output and model input. It is rewritten (or
emptied) atomically with every publish of the partition, so it always describes the published output.

Retrying them (`python -m batch_assets.commands.retry_dead_letters PIPELINE PARTITION`, see docs/RELIABILITY.md) is in
batch_assets/commands/retry_dead_letters.py: this module is what the write stage needs, and imports no stage.
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.spec_sections import PipelineSections
from batch_assets.storage import ArrowStorage, join, partition_file_name, write_parquet
from batch_assets.tasks import task_type

DEAD_LETTER_SCHEMA = pa.schema([
    pa.field("row_id", pa.string()),
    pa.field("_source_file", pa.string()),
    pa.field("_source_row", pa.int64()),
    pa.field("error_class", pa.string()),
    pa.field("error", pa.string()),
    pa.field("raw_output", pa.string()),
    pa.field("model_input", pa.string()),
])

_CLASSES = [  # used when the infer stage did not record an `error_class` column itself
    # the prepare stage's reasons (stages/prepare.py, stages/transforms.py) are the input's, never the model's
    ("input", re.compile(r"^empty input|^bad value|^bad file|image could not be read|document could not be read|input too long|^column '[^']*'(: value .* "
                         r"does not cast| is empty)|^prepare\.function ", re.I)),
    ("transient", re.compile(r"\b(429|5\d\d|timed? ?out|timeout|rate.?limit|connection|retries)\b", re.I)),
]


def dead_letter_url(storage: ArrowStorage, pipeline: str, partition: str) -> str:
    return join(storage.resolved_root(), pipeline, "dead_letters", partition_file_name(partition, "parquet"))


def classify_error(message: str | None) -> str | None:
    if message is None:
        return None
    for name, pattern in _CLASSES:
        if pattern.search(message):
            return name
    return "row"


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)


def dead_letters_of(spec: PipelineSections, batch: pa.RecordBatch) -> pa.RecordBatch | None:
    """The failed rows of an `inferred` batch, in the dead-letter schema; None when none failed."""
    failed = pc.is_valid(batch.column("error"))
    if not pc.any(failed).as_py():
        return None
    rows = batch.filter(failed)
    names = rows.schema.names
    errors = rows.column("error").to_pylist()
    classes = (rows.column("error_class").to_pylist() if "error_class" in names
               else [classify_error(e) for e in errors])
    raw_col = next((c for c in ("raw_output", spec.task.resolved_output_column()) if c in names), None)
    raw = [_text(v) for v in rows.column(raw_col).to_pylist()] if raw_col else [None] * rows.num_rows
    input_col = task_type(spec).text_column  # the prompt or text the model got; None for image and predict tasks
    input_col = input_col if input_col in names else None
    inputs = [_text(v) for v in rows.column(input_col).to_pylist()] if input_col else [None] * rows.num_rows
    return pa.RecordBatch.from_arrays(
        [rows.column("row_id"), rows.column("_source_file"), rows.column("_source_row"),
         pa.array(classes, pa.string()), pa.array(errors, pa.string()), pa.array(raw, pa.string()),
         pa.array(inputs, pa.string())],
        schema=DEAD_LETTER_SCHEMA,
    )


class DeadLetterWriter:
    """Streams the failed rows of a partition into its dead-letter file, committed atomically on a clean exit."""

    def __init__(self, spec: PipelineSections, url: str) -> None:
        self.spec, self.url, self.rows = spec, url, 0
        self._cm = write_parquet(url, DEAD_LETTER_SCHEMA)
        self._writer = None

    def __enter__(self) -> "DeadLetterWriter":
        self._writer = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._cm.__exit__(*exc)

    def add(self, batch: pa.RecordBatch) -> None:
        dead = dead_letters_of(self.spec, batch)
        if dead is not None:
            self._writer.write(dead)
            self.rows += dead.num_rows
