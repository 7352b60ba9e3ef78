"""Preparation: render each row's model input and flag empty inputs. (Row ids are proven unique by the read stage,
or made so by the spec's `prepare.duplicate_ids` policy, which the read stage applies: stages/read.py
`resolve_duplicates`, 8 bytes a row, see batch_assets.reliability.row_ids.)

Empty inputs are flagged (`input_empty`, `input_problem`), never dropped: the infer stage skips them and records
a row error, so every input row id still appears exactly once in the output.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from batch_assets.reliability.row_ids import UniqueIdChecker
from batch_assets.spec import PipelineSpec
from batch_assets.stages.images import prepare_images
from batch_assets.stages.report import PartitionReport
from batch_assets.storage import ArrowStorage, parquet_schema, read_batches, upstream_url, write_parquet
from batch_assets.tasks import task_type


def run_prepare(spec: PipelineSpec, storage: ArrowStorage, key: str) -> PartitionReport:
    """The prepare stage for one partition: `raw` rows in (ids already proven unique by the read stage), `prepared`
    rows (with model inputs) out."""
    import time

    start = time.perf_counter()
    src = upstream_url(storage, spec.name, "raw", key)
    url = storage.stage_url(spec.name, "prepared", key)
    flagged = 0
    raw_rows = [0]

    def raw_batches() -> Iterator[pa.RecordBatch]:
        seen = False
        for batch in read_batches(src, batch_rows=spec.source.batch_rows):
            raw_rows[0] += batch.num_rows
            seen = True
            yield batch
        if not seen:  # an empty partition: one empty batch, so `prepared` gets its typed columns all the same
            yield pa.RecordBatch.from_pylist([], schema=parquet_schema(src))

    with write_parquet(url) as writer:
        for batch in prepare_batches(spec, raw_batches()):
            flagged += sum(batch.column("_input_empty").to_pylist())
            writer.write(batch)
    # A flagged row (empty input) is a row error downstream: it is never sent to the model.
    return PartitionReport(key, raw_rows[0], writer.rows, time.perf_counter() - start, url, {"empty_inputs": flagged},
                           rows_with_errors=flagged)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def prepare_batches(spec: PipelineSpec, batches: Iterator[pa.RecordBatch],
                    ids: UniqueIdChecker | None = None) -> Iterator[pa.RecordBatch]:
    """Prepared batches; each batch's row ids go to `ids`, whose caller checks them once the stream ends."""
    prep, reads = spec.prepare, task_type(spec).reads  # prompt | text | columns | image (batch_assets/tasks)
    for batch in batches:
        if ids is not None:
            ids.add(batch)
        n = batch.num_rows
        problems: list[str | None] = [None] * n
        extra_names: list[str] = []
        extra_arrays: list[pa.Array] = []
        if reads == "prompt":
            fields = prep.template_fields()
            cols = {f: batch.column(f).to_pylist() for f in fields}
            prompts: list[str | None] = []
            for i in range(n):
                empty = [f for f in fields if _blank(cols[f][i])]
                if empty:
                    problems[i] = f"empty input: column {', '.join(map(repr, empty))} is empty"
                    prompts.append(None)
                else:
                    prompts.append(prep.template.format_map({f: cols[f][i] for f in fields}))  # type: ignore[union-attr]
            extra_names.append("_prompt")
            extra_arrays.append(pa.array(prompts, pa.string()))
        elif reads == "text" and prep.template:
            # A text made of several columns (subject + body): a blank field renders as empty text; the row is
            # empty only when every field is (a ticket with a subject and no body still has something to classify).
            fields = prep.template_fields()
            cols = {f: batch.column(f).to_pylist() for f in fields}
            texts = []
            for i in range(n):
                if all(_blank(cols[f][i]) for f in fields):
                    problems[i] = f"empty input: column{'s' if len(fields) > 1 else ''} " \
                                  f"{', '.join(map(repr, fields))} {'are' if len(fields) > 1 else 'is'} empty"
                    texts.append(None)
                else:
                    texts.append(prep.template.format_map(
                        {f: "" if _blank(cols[f][i]) else str(cols[f][i]) for f in fields}).strip())
            extra_names.append("_text")
            extra_arrays.append(pa.array(texts, pa.string()))
        elif reads == "text":
            texts = batch.column(prep.text_column).to_pylist()  # type: ignore[arg-type]
            clean = []
            for i, t in enumerate(texts):
                if _blank(t):
                    problems[i] = f"empty input: column {prep.text_column!r} is empty"
                    clean.append(None)
                else:
                    clean.append(str(t))
            extra_names.append("_text")
            extra_arrays.append(pa.array(clean, pa.string()))
        elif reads == "image":
            refs = batch.column(prep.image_columns[0]).to_pylist()
            for i, ref in enumerate(refs):
                if ref is None or (isinstance(ref, (str, bytes)) and not ref):
                    problems[i] = f"empty input: column {prep.image_columns[0]!r} is empty"
        if prep.image_columns and reads == "prompt":
            images, image_problems = prepare_images(spec, batch)
            problems = [p or q for p, q in zip(problems, image_problems)]
            extra_names.append("_images")
            extra_arrays.append(images)
        if "_read_error" in batch.schema.names:  # a value that did not convert at read (stages/sources/types.py)
            problems = [r or p for r, p in zip(batch.column("_read_error").to_pylist(), problems)]
        flags = pa.array([p is not None for p in problems], pa.bool_())
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, *extra_arrays, flags, pa.array(problems, pa.string())],
            names=[*batch.schema.names, *extra_names, "_input_empty", "_input_problem"],
        )
