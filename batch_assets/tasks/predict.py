"""predict: the user's model class gets the input columns of each chunk and returns one or more output columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.tasks.base import RESERVED_COLUMNS, ChunkPlan, Spec, Task, scatter



class PredictTask(Task):
    kind = "predict"
    default_output = "prediction"
    reads = "columns"
    prepare_fields = frozenset({"input_columns"})
    output_types = True

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        return spec.model_input_columns()

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        return spec.model_input_columns()

    @classmethod
    def produced(cls, spec: Spec) -> set[str]:
        return super().produced(spec) | set(spec.task.output_types or {})

    @classmethod
    def names_own_columns(cls, spec: Spec) -> bool:
        return not spec.task.output_types

    def _plan(self, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]) -> ChunkPlan:
        columns = self.spec.model_input_columns()  # never the evaluation label
        taken = batch.select(columns).take(pa.array(sent))
        return ChunkPlan(sent, {c: taken.column(c).to_pylist() for c in columns}, errors)

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        spec = self.spec
        if results is None:  # no row of the chunk was sent (every row flagged): null outputs, one per row
            return self._nulls(n)
        outputs = results if isinstance(results, dict) else {self.output_column: results}
        clash = sorted(set(outputs) & (RESERVED_COLUMNS | set(spec.source.columns)))
        if clash:
            raise PipelineError(
                f"the model returned column(s) {clash}, which the input or the pipeline already uses",
                column=clash[0],
                fix="rename the model's output keys, or declare them in task.output_types (checked at spec load)",
            )
        declared = spec.task.output_types or {}
        if declared and set(outputs) != set(declared):
            raise PipelineError(
                f"the model returned columns {sorted(outputs)}, but task.output_types declares {sorted(declared)}",
                fix="make the model return the declared columns, or fix task.output_types",
            )
        arrays = []
        for name, values in outputs.items():
            values = values.tolist() if hasattr(values, "tolist") else list(values)
            try:
                arrays.append(pa.array(scatter(values, plan.sent, n)))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise PipelineError(f"the model's output column {name!r} has values of mixed types: {exc}",
                                    column=name, fix="return one type per output column") from None
        return list(outputs), arrays

    def _nulls(self, n: int) -> tuple[list[str], list[pa.Array]]:
        """The declared columns, typed; without output_types only the output column is known before the model
        answers (a model naming its own columns then differs from this chunk's, which the partition's assembly
        refuses naming the fix: declare task.output_types)."""
        types = self._schema() or {self.output_column: pa.null()}
        return list(types), [pa.nulls(n, t) for t in types.values()]

    def _schema(self) -> dict[str, pa.DataType | None]:
        # Without output_types the model names its columns; their types are the ones its chunks agree on.
        return {name: pa.type_for_alias(alias) for name, alias in (self.spec.task.output_types or {}).items()}
