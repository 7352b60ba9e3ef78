"""What every task kind shares: the chunk plan, the one provider call, the alignment check, the flag columns.

A `Task` is built once per partition (`batch_assets.tasks.task_for`) and answers the infer loop's questions about
one chunk of prepared rows:
1. `plan(batch)`: which rows are sent (rows flagged empty in preparation are not) and the provider's inputs;
2. `call(inputs)`: the ONE place the loop calls a provider (a response cache or any other wrapper goes around the
   provider object; nothing else in the loop touches it);
3. `check(sent, results)` then `columns(plan, results)`: exactly one result per sent row, or a PipelineError naming
   provider, method and counts; then the output columns, in the types `schema()` declares up front, never guessed
   from one chunk.
Class methods answer what is known from the spec alone (spec checks, preparation, previews, checkpoints), so the
spec check and the prepare stage ask the same table as the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError, Problems
from batch_assets.tasks.token_limits import TokenLimit
from batch_assets.resources.protocols import CAPABILITIES, GenerationParams

# A parsed PipelineSpec (batch_assets/spec.py). The spec imports this table to check itself, so the table names the
# spec's type without importing it: imports run one way (tests/test_layout.py counts type-only imports too).
Spec = Any

# Columns the infer stage adds besides the task's outputs; a model may not return columns with these names.
ERROR_COLUMN = "error"
TRUNCATED_COLUMN = "input_truncated"
# Columns the stages add to every row (lineage, preparation, the infer loop's error column): no source column or
# model output may take these names, or one would overwrite the other after the model was paid for.
RESERVED_COLUMNS = frozenset({ERROR_COLUMN, "row_id", "_source_file", "_source_row", "_input_empty",
                              "_input_problem", "_read_error", "_text", "_prompt", "_images", "_files",
                              TRUNCATED_COLUMN})



@dataclass
class ChunkPlan:
    """A chunk's rows as the provider sees them: `sent` are positions within the chunk, `inputs` the call's
    argument, `errors` one slot per row of the chunk (preparation problems already filled in)."""

    sent: np.ndarray
    inputs: Any
    errors: list[str | None]
    truncated: list[bool] | None = None  # `input_truncated`, one per row of the chunk, when inputs are cut to a limit


class Task:
    """One task kind. Subclasses set the class attributes and override the `_`-prefixed hooks."""

    kind: ClassVar[str]
    default_output: ClassVar[str]  # the output column unless task.output_column names another
    reads: ClassVar[str]  # the model's input as prepared: prompt | text | columns | image | audio
    text_column: ClassVar[str | None] = None  # the prepared text a token limit counts (text kinds only)
    vectors: ClassVar[bool] = False  # writes embedding vectors (no csv sink, nothing to evaluate)
    counts_tokens: ClassVar[bool] = False  # writes prompt_tokens / completion_tokens
    extra_outputs: ClassVar[tuple[str, ...]] = ()  # written besides the output column (spec clash check)
    structured: ClassVar[bool] = False  # may take task.structured
    output_types: ClassVar[bool] = False  # may take task.output_types
    # The task-specific prepare fields this kind reads; a spec setting another one is refused (it would be ignored)
    prepare_fields: ClassVar[frozenset[str]] = frozenset()
    task_fields: ClassVar[frozenset[str]] = frozenset()  # likewise for the task section (TASK_SPECIFIC_TASK_FIELDS)

    def __init__(self, spec: Spec, provider: Any, params: GenerationParams | None = None,
                 limit: TokenLimit | None = None):
        self.spec, self.provider, self.params, self.limit = spec, provider, params, limit
        self.method = CAPABILITIES[self.kind][1]
        self.output_column = spec.task.resolved_output_column()
        self.truncates = self.truncating(spec)

    # -- from the spec alone ------------------------------------------------------------------------------------------
    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        """What this kind needs from the rest of the spec (the generic checks stay in PipelineSpec)."""
        problems: Problems = []
        if spec.prepare.max_input_tokens is not None and cls.text_column is None:
            problems.append(("prepare.max_input_tokens", f"applies to text tasks (embed, classify, generate), not "
                             f"{cls.kind!r}"))
        if spec.task.structured is not None and not cls.structured:
            problems.append(("task.structured", "structured output applies to task 'generate' only"))
        if spec.task.output_types is not None and not cls.output_types:
            problems.append(("task.output_types", "output_types applies to task 'predict' only"))
        return problems + cls._ignored_fields(spec)

    @classmethod
    def _ignored_fields(cls, spec: Spec) -> Problems:
        """A prepare field set to something other than its default that this kind would not read is refused: a
        setting silently ignored is a bug the user only finds in the output."""
        prep, problems = spec.prepare, []
        for section, model, fields, own in (("prepare", prep, TASK_PREPARE_FIELDS, cls.prepare_fields),
                                            ("task", spec.task, TASK_SPECIFIC_TASK_FIELDS, cls.task_fields)):
            defaults = type(model).model_fields
            for name in sorted(fields - own):
                if _set(model, name):
                    listed = ", ".join(sorted(own)) or "none of them"
                    problems.append((f"{section}.{name}", f"task {cls.kind!r} does not use it, so it would be "
                                     f"ignored (its task-specific {section} fields: {listed}): remove it"))
        task = spec.task
        if "label_column" in cls.task_fields and not task.labels:
            problems += [(f"task.{name}", "applies only with task.labels, which is not set: remove it or set labels")
                         for name in ("label_column", "default_label") if _set(task, name)]
        if "structured_column" in cls.task_fields and task.structured is None and _set(task, "structured_column"):
            problems.append(("task.structured_column", "applies only with task.structured, which is not set: "
                             "remove it or set structured"))
        defaults = type(prep).model_fields
        dependent = {"too_long": "max_input_tokens", "image_max_side": "image_columns", "duplicate_ids": "id_column"}
        for name, needs in dependent.items():
            if name in prep.model_fields_set and getattr(prep, needs) in (None, []) \
                    and getattr(prep, name) != defaults[name].get_default():
                problems.append((f"prepare.{name}", f"applies only with prepare.{needs}, which is not set: remove it "
                                 f"or set {needs}"))
        return problems

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        """The source columns the model's input is made of (never the evaluation label)."""
        raise NotImplementedError

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        """The prepared columns the model's input is read from: a committed chunk is reused only if they are
        unchanged."""
        raise NotImplementedError

    @classmethod
    def produced(cls, spec: Spec) -> set[str]:
        """The columns the task writes (checked against the source's at spec load)."""
        return {spec.task.resolved_output_column(), *cls.extra_outputs}

    @classmethod
    def prediction_column(cls, spec: Spec) -> str | None:
        """The column holding the task's answer to score against a label (None: the task predicts no label)."""
        return spec.task.resolved_output_column()

    @classmethod
    def predicted_labels(cls, spec: Spec) -> tuple[str, list[str]] | None:
        """(column, declared labels) for a task that predicts one of a set of labels; None for other tasks."""
        return None

    @classmethod
    def names_own_columns(cls, spec: Spec) -> bool:
        """Whether the model names its output columns itself (nothing declares them before it runs)."""
        return False

    @classmethod
    def generation_params(cls, spec: Spec) -> GenerationParams | None:
        """The sampling params sent with every call (generate only)."""
        return None

    @classmethod
    def user_column(cls, spec: Spec) -> str:
        """What the user calls the text a token limit counts (`text_column`), for messages."""
        return str(cls.text_column)

    @staticmethod
    def truncating(spec: Spec) -> bool:
        """Whether the output has the `input_truncated` flag column."""
        return spec.prepare.max_input_tokens is not None and spec.prepare.too_long == "truncate"

    # -- one chunk ----------------------------------------------------------------------------------------------------
    def plan(self, batch: pa.RecordBatch) -> ChunkPlan:
        errors: list[str | None] = batch.column("_input_problem").to_pylist()
        empty = batch.column("_input_empty").to_numpy(zero_copy_only=False)
        return self._plan(batch, np.flatnonzero(~empty), errors)

    def call(self, inputs: Any, on_answer: Any = None) -> Any:
        """The loop's only call into a provider, for every task kind. `on_answer(position, result)`, for providers
        that answer row by row (`answers_each_row`), hears each row's result as it arrives (the answer journal)."""
        kwargs = {} if on_answer is None else {"on_answer": on_answer}
        return getattr(self.provider, self.method)(inputs, *self._call_args(), **kwargs)

    def check(self, sent: int, results: Any) -> None:
        """Exactly one result per row sent; anything else would attach outputs to the wrong rows."""
        where = f"{type(self.provider).__name__}.{self.method}"
        if isinstance(results, dict):
            counts = {name: _length(values) for name, values in results.items()}
        else:
            counts = {"": _length(results)}
        bad = {name: n for name, n in counts.items() if n != sent}
        if bad:
            detail = ", ".join(f"{n} for column {name!r}" if name else str(n) for name, n in bad.items())
            raise PipelineError(
                f"{where} returned {detail} results for {sent} rows: a provider must return exactly one result per "
                "row, in order; nothing was published",
                fix="fix the provider (a custom model class must return one output per input row); if it is a "
                "built-in provider, report a bug with this message",
            )

    def columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        """The chunk's output columns (one value per row of the chunk, null where a row was not sent or failed),
        then `input_truncated` when inputs are cut to a limit; row errors from the results go into `plan.errors`."""
        names, arrays = self._columns(plan, results, n)
        if self.truncates:
            names, arrays = [*names, TRUNCATED_COLUMN], [*arrays, pa.array(plan.truncated or [False] * n, pa.bool_())]
        return names, arrays

    def schema(self) -> dict[str, pa.DataType | None]:
        """The output columns and their types, known before any row is inferred. None: the type comes from the
        model's values (predict without `task.output_types`; embeddings whose size the provider does not declare)
        and must be the same in every chunk."""
        types = self._schema()
        if self.truncates:
            types[TRUNCATED_COLUMN] = pa.bool_()
        return types

    # -- hooks --------------------------------------------------------------------------------------------------------
    def _plan(self, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]) -> ChunkPlan:
        raise NotImplementedError

    def _call_args(self) -> tuple[Any, ...]:
        return ()

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        raise NotImplementedError

    def _schema(self) -> dict[str, pa.DataType | None]:
        raise NotImplementedError


def _set(model: Any, name: str) -> bool:
    """Whether the spec sets the field to something other than its default (an explicit default is no setting)."""
    field = type(model).model_fields[name]
    return name in model.model_fields_set and getattr(model, name) != field.get_default(call_default_factory=True)


# The task fields that only some task kinds read (structured and output_types have their own messages above).
TASK_SPECIFIC_TASK_FIELDS = frozenset({"params", "labels", "label_column", "default_label", "structured_column"})
# The prepare fields that only some task kinds read (each kind lists its own in `prepare_fields`). max_input_tokens
# has its own message above.
TASK_PREPARE_FIELDS = frozenset({"template", "system", "text_column", "input_columns", "image_columns",
                                 "image_max_side", "documents", "file_columns"})


def _length(values: Any) -> int:
    if values is None:
        return 0
    shape = getattr(values, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return len(values)


def scatter(values: list[Any], sent: np.ndarray, n: int) -> list[Any]:
    """One value per row of the chunk: `values` (one per sent row, in order) at the sent positions, None elsewhere."""
    # Alignment was checked before: len(values) == len(sent), so zip loses nothing.
    out: list[Any] = [None] * n
    for i, v in zip(sent.tolist(), values):
        out[i] = v
    return out


def note_row_errors(results: Any, sent: np.ndarray, errors: list[str | None]) -> None:
    """A result's own error (classify, generate) becomes its row's error."""
    for i, r in zip(sent.tolist(), results):
        if r.error:
            errors[i] = r.error
