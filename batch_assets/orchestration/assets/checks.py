"""The blocking checks that guard publishing, evaluated on `inferred` before the write stage may run.

- `rows_exactly_once`: the row ids of `inferred` are the row ids of the SOURCE (read again, not the `raw` copy),
  each exactly once (under `prepare.duplicate_ids: keep_first / keep_last`, each distinct source id once). Compared as multiset fingerprints (batch_assets/reliability/row_ids.py `RowIdFingerprint`), so memory does
  not grow with the partition: equal multisets always pass; a missing, repeated or foreign id changes the
  fingerprint except with probability ~2^-64.
- `error_rate`: rows the model failed on (after retries) over rows, at most `runtime.max_error_fraction`.
- `output_schema`: every declared output column is present with its declared type (`Task.schema()`,
  batch_assets/tasks/), `error` is a string column, and no output column is left without a type.
A failed blocking check fails the infer step after recording its result: the output asset does not run.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from batch_assets.partitions import resolve_partition
from batch_assets.reliability.row_ids import RowIdFingerprint, UniqueIdChecker, row_hashes
from batch_assets.spec import PipelineSpec
from batch_assets.stages.read import read_partition
from batch_assets.stages.report import PartitionReport, error_fraction
from batch_assets.stages.trial import trial_fingerprint
from batch_assets.storage import parquet_schema, read_batches
from batch_assets.tasks import ERROR_COLUMN, task_type

ROWS_CHECK, ERROR_CHECK, SCHEMA_CHECK = "rows_exactly_once", "error_rate", "output_schema"


def source_digest(spec: PipelineSpec, key: str) -> RowIdFingerprint:
    digest = RowIdFingerprint()
    keeps_one = spec.prepare.id_column is not None and spec.prepare.duplicate_ids != "fail"
    ids = UniqueIdChecker() if keeps_one else None
    for batch in read_partition(spec, resolve_partition(spec, key), ids_only=True):
        hashes = row_hashes(batch)  # hashed by this read itself (`_row_hash`), not a second time
        if ids is not None:
            ids.add_hashes(hashes)
        else:
            digest.add_hashes(hashes)
    if ids is not None:  # keep_first / keep_last: each distinct source id exactly once (8 bytes a row, as the read)
        digest.add_hashes(ids.distinct())
    return digest


def file_digest(url: str) -> RowIdFingerprint:
    digest = RowIdFingerprint()
    for batch in read_batches(url, columns=["row_id"]):
        digest.add(batch)
    return digest


def rows_problem(spec: PipelineSpec, key: str, url: str) -> tuple[str | None, dict[str, Any]]:
    trial = trial_fingerprint(url) if spec.prepare.trial else None
    # A trial (stages/trial.py) is checked against the rows it kept, and says so
    src, out = (trial if trial is not None else source_digest(spec, key)), file_digest(url)
    facts = {"source_rows": src.count, "inferred_rows": out.count, **({"trial": True} if trial is not None else {})}
    if src == out:
        return None, facts
    if src.count != out.count:
        return f"{out.count} rows for {src.count} source rows", facts
    return "as many rows as the source, but not the same row ids (some missing, some repeated or foreign)", facts


def error_problem(spec: PipelineSpec, report: PartitionReport) -> tuple[str | None, dict[str, Any]]:
    rows, failed = report.rows_out, int(report.extra.get("model_errors", 0))
    fraction = error_fraction(report)  # the same number as the partition's `error_rate` metadata
    facts = {"rows": rows, "model_errors": failed, "input_problems": int(report.extra.get("rows_with_errors", 0)) - failed,
             "error_fraction": round(fraction, 4), "max_error_fraction": spec.runtime.max_error_fraction}
    if fraction > spec.runtime.max_error_fraction:
        samples = report.extra.get("error_samples")
        lines = str(getattr(samples, "value", samples) or "").split("\n")
        first = next((line.removeprefix("- ") for line in lines if line and "empty input:" not in line), "")
        return (f"{failed} of {rows} rows failed in the model ({fraction:.1%}), more than max_error_fraction="
                f"{spec.runtime.max_error_fraction:g}" + (f"; e.g. {first}" if first else "")), facts
    return None, facts


def schema_problem(spec: PipelineSpec, provider: Any, report: PartitionReport, url: str) -> tuple[str | None, dict[str, Any]]:
    schema = parquet_schema(url)
    task = task_type(spec)
    declared = task(spec, provider).schema()
    if task.names_own_columns(spec):
        # the model named its own columns: those after the prepared ones (which end with `_input_problem`)
        first = schema.get_field_index("_input_problem") + 1
        declared = {name: None for name in schema.names[first:] if name != ERROR_COLUMN}
    problems = []
    for name, type_ in {**declared, ERROR_COLUMN: pa.string()}.items():
        if name not in schema.names:
            problems.append(f"column {name!r} is missing")
        elif type_ is not None and schema.field(name).type != type_:
            problems.append(f"column {name!r} is {schema.field(name).type}, declared {type_}")
        elif schema.field(name).type == pa.null() and report.rows_out > int(report.extra.get("rows_with_errors", 0)):
            problems.append(f"column {name!r} has no type although rows succeeded (every value null)")
    facts = {name: str(schema.field(name).type) for name in declared if name in schema.names}
    return ("; ".join(problems) or None), facts


def blocking_check_specs(spec: PipelineSpec, asset_key: Any) -> list[Any]:
    import dagster as dg

    def make(name: str, description: str) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(name, asset=asset_key, blocking=True, description=description)

    return [
        make(ROWS_CHECK, "Blocking: every row id of the source partition appears exactly once in `inferred`."),
        make(ERROR_CHECK, f"Blocking: at most {spec.runtime.max_error_fraction:g} of the rows failed in the model."),
        make(SCHEMA_CHECK, "Blocking: the output columns have the declared types."),
    ]


def blocking_check_results(spec: PipelineSpec, provider: Any, reports: list[PartitionReport]) -> list[Any]:
    """One result per check over every partition of the run; a failing partition fails the check and is named."""
    import dagster as dg

    evaluations = {
        ROWS_CHECK: lambda r: rows_problem(spec, r.key, r.path),
        ERROR_CHECK: lambda r: error_problem(spec, r),
        SCHEMA_CHECK: lambda r: schema_problem(spec, provider, r, r.path),
    }
    results = []
    for name, evaluate in evaluations.items():
        failures: dict[str, str] = {}
        facts: dict[str, Any] = {}
        for report in reports:
            problem, partition_facts = evaluate(report)
            facts[report.key] = partition_facts
            if problem:
                failures[report.key] = problem
        summary = "; ".join(f"partition {k!r}: {v}" for k, v in failures.items())
        results.append(dg.AssetCheckResult(
            check_name=name,
            passed=not failures,
            severity=dg.AssetCheckSeverity.ERROR,
            description=summary or "passed",
            metadata={"partitions": dg.MetadataValue.json(facts),
                      "failures": dg.MetadataValue.md(summary or "none")},
        ))
    return results
