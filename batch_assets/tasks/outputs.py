"""The two outputs text and image tasks share: an embedding vector per row, or a label with its score."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.tasks.base import ChunkPlan, Problems, Spec, Task, note_row_errors, scatter



class Vectors(Task):
    """embed, embed_image: one float32 vector per row."""

    default_output = "embedding"
    vectors = True

    @classmethod
    def prediction_column(cls, spec: Spec) -> str | None:
        return None

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        return [self.output_column], [_vectors_column(results, plan.sent, n)]

    def _schema(self) -> dict[str, pa.DataType | None]:
        dim = self.provider.vector_dimensions()
        return {self.output_column: pa.list_(pa.float32(), dim) if dim else None}


class Labels(Task):
    """classify, classify_image: one of `task.labels` per row, with the model's score."""

    default_output = "label"
    extra_outputs = ("score",)
    task_fields = frozenset({"labels"})

    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        problems = super().spec_problems(spec)
        if not spec.task.labels:
            problems.append(("task.labels", f"task {cls.kind!r} needs candidate labels"))
        return problems

    @classmethod
    def predicted_labels(cls, spec: Spec) -> tuple[str, list[str]] | None:
        return (spec.task.resolved_output_column(), list(spec.task.labels)) if spec.task.labels else None

    def _call_args(self) -> tuple[Any, ...]:
        return (self.spec.task.labels,)

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        results = results or []  # None: no row of the chunk was sent (every image unreadable, every input empty)
        note_row_errors(results, plan.sent, plan.errors)
        labels = scatter([r.label for r in results], plan.sent, n)
        scores = scatter([r.score for r in results], plan.sent, n)
        return [self.output_column, "score"], [pa.array(labels, pa.string()), pa.array(scores, pa.float64())]

    def _schema(self) -> dict[str, pa.DataType | None]:
        return {self.output_column: pa.string(), "score": pa.float64()}


def _vectors_column(vectors: Any, sent: np.ndarray, n: int) -> pa.Array:
    """Zero-copy when every row was sent: the model's (rows, dim) float32 buffer becomes the column's values."""
    array = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32)) if vectors is not None else None
    if array is None or array.size == 0:
        return pa.nulls(n)
    if array.ndim != 2:
        raise PipelineError(f"the embedder returned an array of shape {array.shape}; expected (rows, dimensions)",
                            fix="fix the provider: one flat vector per row")
    dim = int(array.shape[1])
    if len(sent) == n:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.ravel()), dim)
    full = np.zeros((n, dim), dtype=np.float32)
    full[sent] = array
    missing = np.ones(n, dtype=bool)
    missing[sent] = False
    return pa.FixedSizeListArray.from_arrays(pa.array(full.ravel()), dim, mask=pa.array(missing))
