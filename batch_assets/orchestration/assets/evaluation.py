"""Evaluation built into the pipeline: accuracy and a confusion table against a labelled column (a golden slice).

The spec's `evaluation.label_column` is a source column holding each row's true label. It travels with the row
(read -> prepare -> infer) like any pass-through column, but the spec refuses any prompt, text or input that uses
it and `predict` leaves it out of the model's inputs, so the model never sees the answer. After the infer stage
writes a partition, its Parquet file is streamed for just the two columns and counted into a confusion matrix.

Comparison ignores case and surrounding space ("law firm" == "Law Firm"); rows with no true label are not scored;
rows whose prediction is missing (a row error) are scored as wrong, under the predicted label "(no answer)".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from batch_assets.errors import PipelineError
from batch_assets.spec import PipelineSpec
from batch_assets.storage import parquet_schema, read_batches

NO_ANSWER = "(no answer)"
CHECK_NAME = "evaluation"


def _norm(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text.casefold() if text else None


@dataclass
class Confusion:
    """Counts of (true label, predicted label) pairs; labels keep the spelling first seen."""

    pairs: Counter = field(default_factory=Counter)
    unlabelled: int = 0
    _spelling: dict[str, str] = field(default_factory=dict, repr=False)

    def add(self, truths: list[Any], predictions: list[Any]) -> None:
        for truth, pred in zip(truths, predictions, strict=True):
            t = _norm(truth)
            if t is None:
                self.unlabelled += 1
                continue
            p = _norm(pred)
            self._spelling.setdefault(t, str(truth).strip())
            if p is not None:
                self._spelling.setdefault(p, str(pred).strip())
            self.pairs[(t, p if p is not None else NO_ANSWER)] += 1

    def merge(self, other: "Confusion") -> "Confusion":
        out = Confusion(self.pairs + other.pairs, self.unlabelled + other.unlabelled)
        out._spelling = {**other._spelling, **self._spelling}
        return out

    @property
    def labelled(self) -> int:
        return sum(self.pairs.values())

    @property
    def correct(self) -> int:
        return sum(n for (t, p), n in self.pairs.items() if t == p)

    @property
    def accuracy(self) -> float:
        return self.correct / self.labelled if self.labelled else 0.0

    def _name(self, norm: str) -> str:
        return self._spelling.get(norm, norm)

    def table(self) -> dict[str, dict[str, int]]:
        """{true label: {predicted label: rows}}, in display spelling."""
        out: dict[str, dict[str, int]] = {}
        for (t, p), n in sorted(self.pairs.items()):
            out.setdefault(self._name(t), {})[self._name(p)] = n
        return out

    def markdown(self) -> str:
        """Rows: true label; columns: predicted label; the last column is that label's recall."""
        if not self.pairs:
            return "_no labelled rows_"
        truths = sorted({t for t, _ in self.pairs}, key=self._name)
        preds = sorted({p for _, p in self.pairs} - {NO_ANSWER}, key=self._name)
        if any(p == NO_ANSWER for _, p in self.pairs):
            preds.append(NO_ANSWER)
        header = "| true \\ predicted | " + " | ".join(self._name(p) for p in preds) + " | recall |"
        lines = [header, "|---|" + "---:|" * (len(preds) + 1)]
        for t in truths:
            row = [self.pairs.get((t, p), 0) for p in preds]
            total = sum(row)
            cells = [f"**{n}**" if p == t and n else str(n) for p, n in zip(preds, row)]
            recall = f"{self.pairs.get((t, t), 0) / total:.0%}" if total else "-"
            lines.append(f"| {self._name(t)} | " + " | ".join(cells) + f" | {recall} |")
        return "\n".join(lines)


def evaluate_file(spec: PipelineSpec, url: str) -> Confusion:
    """Stream one partition's inferred Parquet file (two columns only) into a confusion matrix."""
    assert spec.evaluation is not None
    truth_col = spec.evaluation.label_column
    pred_col = spec.prediction_column()
    names = parquet_schema(url).names
    for column, role in ((truth_col, "evaluation.label_column"), (pred_col, "evaluation.prediction_column")):
        if column not in names:
            raise PipelineError(
                f"the evaluation needs column {column!r}, which the inferred data lacks (it has: {', '.join(names)})",
                file=url, column=column, fix=f"set {role} in the spec to a column the infer stage writes",
            )
    confusion = Confusion()
    for batch in read_batches(url, columns=[truth_col, pred_col]):
        confusion.add(batch.column(0).to_pylist(), batch.column(1).to_pylist())
    return confusion


def partition_metadata(confusion: Confusion) -> dict[str, Any]:
    """Per-partition materialization metadata (floats and ints, so Dagster plots accuracy over partitions)."""
    return {
        "eval_accuracy": dg.MetadataValue.float(round(confusion.accuracy, 4)),
        "eval_labelled_rows": dg.MetadataValue.int(confusion.labelled),
        "eval_correct_rows": dg.MetadataValue.int(confusion.correct),
    }


def check_spec(spec: PipelineSpec, asset_key: dg.AssetKey) -> dg.AssetCheckSpec:
    ev = spec.evaluation
    assert ev is not None
    bar = f"; fails below {ev.min_accuracy:.0%}" if ev.min_accuracy is not None else ""
    return dg.AssetCheckSpec(
        CHECK_NAME, asset=asset_key,
        description=f"Accuracy of `{spec.prediction_column()}` against the labelled column `{ev.label_column}` "
        f"(never shown to the model), with a confusion table{bar}. Fails when no row is labelled.",
    )


def check_result(spec: PipelineSpec, by_partition: dict[str, Confusion]) -> dg.AssetCheckResult:
    """One check result over every partition of the run."""
    ev = spec.evaluation
    assert ev is not None
    total = Confusion()
    for confusion in by_partition.values():
        total = total.merge(confusion)
    passed = total.labelled > 0 and (ev.min_accuracy is None or total.accuracy >= ev.min_accuracy)
    metadata: dict[str, Any] = {
        "accuracy": dg.MetadataValue.float(round(total.accuracy, 4)),
        "labelled_rows": dg.MetadataValue.int(total.labelled),
        "correct_rows": dg.MetadataValue.int(total.correct),
        "unlabelled_rows": dg.MetadataValue.int(total.unlabelled),
        "confusion": dg.MetadataValue.md(total.markdown()),
        "label_column": dg.MetadataValue.text(ev.label_column),
        "prediction_column": dg.MetadataValue.text(str(spec.prediction_column())),
    }
    if ev.min_accuracy is not None:
        metadata["min_accuracy"] = dg.MetadataValue.float(ev.min_accuracy)
    if len(by_partition) > 1:
        metadata["accuracy_by_partition"] = dg.MetadataValue.md(
            "| partition | accuracy | labelled |\n|---|---:|---:|\n" + "\n".join(
                f"| {key} | {c.accuracy:.1%} | {c.labelled} |" for key, c in by_partition.items()))
    if total.labelled == 0:
        metadata["why"] = dg.MetadataValue.text(
            f"no row has a value in {ev.label_column!r}: check evaluation.label_column and the source data")
    return dg.AssetCheckResult(
        check_name=CHECK_NAME,
        passed=passed,
        severity=dg.AssetCheckSeverity.ERROR if ev.severity == "error" else dg.AssetCheckSeverity.WARN,
        metadata=metadata,
    )
