"""Preparation: the spec's column transforms, documents, joins and user function, then each row's model input, with
rows that cannot be an input flagged. (Row ids are proven unique by the read stage, or made so by the spec's
`prepare.duplicate_ids` policy, which the read stage applies: stages/read.py `resolve_duplicates`, 8 bytes a row,
see batch_assets.reliability.row_ids.)

A row is flagged (`_input_empty`, with the reason in `_input_problem`), never dropped: its input is empty, a value
did not cast, a required column is missing, or the user function gave a reason. The infer stage skips flagged rows
and records the reason as the row's error, so every input row id still appears exactly once in the output and a
flagged row lands in the dead letters. The column work itself is in stages/transforms.py; a trial run's row
selection in stages/trial.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from batch_assets.reliability.row_ids import UniqueIdChecker
from batch_assets.spec_sections import PipelineSections
from batch_assets.stage_names import PREPARE, READ
from batch_assets.stages.documents import extract_documents, prepare_file_parts
from batch_assets.stages.images import prepare_images
from batch_assets.stages.report import PartitionReport
from batch_assets.stages.transforms import (
    UserFunction,
    apply_joins,
    apply_transforms,
    as_text,
    join_present,
    missing,
    render_template,
)
from batch_assets.stages.trial import TrialSelection
from batch_assets.storage import ArrowStorage, parquet_rows, parquet_schema, read_batches, upstream_url, write_parquet
from batch_assets.tasks import task_type

EMPTY = "empty input"  # the prefix of an empty input's reason (the other reasons are the transforms' and function's)
_NO_REASON = pa.scalar(None, pa.string())


def run_prepare(spec: PipelineSections, storage: ArrowStorage, key: str) -> PartitionReport:
    """The prepare stage for one partition: `raw` rows in (ids already proven unique by the read stage), `prepared`
    rows (with model inputs) out."""
    start = time.perf_counter()
    src = upstream_url(storage, spec.name, READ.asset, key)
    url = storage.stage_url(spec.name, PREPARE.asset, key)
    counts = {"empty_inputs": 0, "rows_flagged": 0}
    raw_rows = [0]
    trial = TrialSelection(spec.prepare.trial) if spec.prepare.trial else None

    def raw_batches() -> Iterator[pa.RecordBatch]:
        seen = False
        batches = read_batches(src, batch_rows=spec.source.batch_rows)
        for batch in trial(batches) if trial else batches:
            raw_rows[0] += batch.num_rows
            seen = True
            yield batch
        if not seen:  # an empty partition: one empty batch, so `prepared` gets its typed columns all the same
            yield pa.RecordBatch.from_pylist([], schema=parquet_schema(src))

    with write_parquet(url) as writer:
        for batch in prepare_batches(spec, raw_batches(), key=key):
            problems = batch.column("_input_problem")
            counts["rows_flagged"] += len(problems) - problems.null_count
            counts["empty_inputs"] += pc.sum(pc.fill_null(pc.starts_with(problems, EMPTY), False)).as_py() or 0
            writer.write(batch)
        extra: dict = {"empty_inputs": counts["empty_inputs"],
                       "transform_row_errors": counts["rows_flagged"] - counts["empty_inputs"]}
        if trial is not None:
            in_partition = parquet_rows(src)
            writer.key_value_metadata.update(trial.footer(in_partition))
            extra.update({"trial": True, "trial_rows_kept": writer.rows, "trial_rows_in_partition": in_partition})
    # A flagged row is a row error downstream: it is never sent to the model.
    return PartitionReport(key, parquet_rows(src) if trial else raw_rows[0], writer.rows, time.perf_counter() - start,
                           url, extra, rows_with_errors=counts["rows_flagged"])


def _empty_reason(fields: list[str], missing_by_field: list[pa.Array], when: pa.Array) -> pa.Array:
    """'empty input: column 'a', 'b' is empty' where `when`, naming the fields missing in that row; else null."""
    named = [pc.if_else(m, pa.scalar(repr(f)), _NO_REASON) for f, m in zip(fields, missing_by_field)]
    names = pc.fill_null(join_present(named, ", "), "")
    count = pc.cast(missing_by_field[0], pa.int32())
    for m in missing_by_field[1:]:
        count = pc.add(count, pc.cast(m, pa.int32()))
    several = pc.greater(count, 1)
    verb = pc.if_else(several, pa.scalar("s "), pa.scalar(" "))
    tail = pc.if_else(several, pa.scalar(" are empty"), pa.scalar(" is empty"))
    text = pc.binary_join_element_wise(f"{EMPTY}: column", verb, names, tail, "")
    return pc.if_else(when, text, _NO_REASON)


def _any(flags: list[pa.Array], n: int) -> pa.Array:
    out = pa.array([False] * n, pa.bool_())
    for flag in flags:
        out = pc.or_(out, flag)
    return out


def prepare_batches(spec: PipelineSections, batches: Iterator[pa.RecordBatch], ids: UniqueIdChecker | None = None,
                    key: str | None = None) -> Iterator[pa.RecordBatch]:
    """Prepared batches; each batch's row ids go to `ids`, whose caller checks them once the stream ends."""
    prep, reads = spec.prepare, task_type(spec).reads  # prompt | text | columns | image | audio (batch_assets/tasks)
    function = UserFunction(spec, key or "?") if prep.function else None
    optional = {name for name, rule in prep.transforms.items() if rule.required is False}
    for batch in batches:
        if ids is not None:
            ids.add(batch)
        n = batch.num_rows
        problems = pa.nulls(n, pa.string())
        batch, problems = apply_transforms(prep, batch, problems)
        batch, problems = extract_documents(spec, batch, problems)  # PDF / HTML / Markdown files to text columns
        batch = apply_joins(prep, batch)
        if function is not None:
            batch, problems = function(batch, problems)
        extra: dict[str, pa.Array] = {}
        if reads in ("prompt", "text") and (prep.template or prep.text_column):
            fields = prep.template_fields() if prep.template else [prep.text_column]
            gone = [missing(as_text(batch.column(f))) for f in fields]
            if reads == "prompt":  # a prompt needs every field the spec does not mark optional (required: false)
                needed = [(f, m) for f, m in zip(fields, gone) if f not in optional]
                empty = _any([m for _, m in needed], n)
                reason = _empty_reason([f for f, _ in needed], [m for _, m in needed], empty) if needed else \
                    pa.nulls(n, pa.string())
            else:  # a text of several columns is empty only when every one is (a subject without body still counts)
                empty = pc.invert(_any([pc.invert(m) for m in gone], n))
                reason = _empty_reason(fields, gone, empty)
            if prep.template:
                rendered = render_template(prep.template, batch)
                if reads == "text":
                    rendered = pc.utf8_trim_whitespace(rendered)
            else:
                rendered = as_text(batch.column(prep.text_column))
            problems = pc.coalesce(problems, reason)
            extra["_prompt" if reads == "prompt" else "_text"] = pc.if_else(pc.is_null(problems), rendered, _NO_REASON)
        elif reads in ("image", "audio"):  # one file reference per row: a missing one is an empty input
            column = task_type(spec).model_input(spec)[0]
            refs = batch.column(column).to_pylist()
            reasons = [f"{EMPTY}: column {column!r} is empty"
                       if ref is None or (isinstance(ref, (str, bytes)) and not ref) else None for ref in refs]
            problems = pc.coalesce(problems, pa.array(reasons, pa.string()))
        if prep.image_columns and reads == "prompt":
            images, image_problems = prepare_images(spec, batch)
            problems = pc.coalesce(problems, pa.array(image_problems, pa.string()))
            extra["_images"] = images
        if prep.file_columns and reads == "prompt":  # PDFs sent whole, as file parts
            files, file_problems = prepare_file_parts(spec, batch)
            problems = pc.coalesce(problems, pa.array(file_problems, pa.string()))
            extra["_files"] = files
        if "_read_error" in batch.schema.names:  # a value that did not convert at read (stages/sources/types.py)
            problems = pc.coalesce(batch.column("_read_error"), problems)
        flags = pc.is_valid(problems)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, *extra.values(), flags, problems],
            names=[*batch.schema.names, *extra, "_input_empty", "_input_problem"],
        )
