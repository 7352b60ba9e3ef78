"""What one chunk of prepared rows becomes for each task kind: the provider call, the alignment check, the columns.

Three steps per chunk, the same for every task kind:
1. `plan_chunk`: which rows are sent (rows flagged empty in preparation are not) and the provider's inputs;
2. `call_provider`: the ONE place the loop calls a provider (a response cache or any other wrapper goes around the
   provider object; nothing else in the loop touches it);
3. `check_alignment` then `output_columns`: exactly one result per sent row, or a PipelineError naming provider,
   method and counts; then the output columns, in types declared up front (`declared_output_types`), never guessed
   from one chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.spec import PipelineSpec
from batch_assets.stages.token_limits import TRUNCATED_COLUMN, TokenLimit, text_column
from resources.protocols import CAPABILITIES, GenerationParams

# Columns the infer stage adds besides the task's outputs; a model may not return columns with these names.
ERROR_COLUMN = "error"


@dataclass
class ChunkPlan:
    """A chunk's rows as the provider sees them: `sent` are positions within the chunk, `inputs` the call's
    argument, `errors` one slot per row of the chunk (preparation problems already filled in)."""

    sent: np.ndarray
    inputs: Any
    errors: list[str | None]
    truncated: list[bool] | None = None  # `input_truncated`, one per row of the chunk, when inputs are cut to a limit


def method_name(spec: PipelineSpec) -> str:
    return CAPABILITIES[spec.task.kind][1]


def model_input_columns(spec: PipelineSpec) -> list[str]:
    """The prepared columns a task's outputs depend on: a committed chunk is reused only if these are unchanged."""
    kind, prep = spec.task.kind, spec.prepare
    cols = ["row_id", "_input_empty"]
    if kind == "generate":
        cols.append("_prompt")
        if prep.image_columns:
            cols.append("_images")
    elif kind in ("embed", "classify"):
        cols.append("_text")
    elif kind == "predict":
        cols += spec.model_input_columns()
    else:
        cols.append(prep.image_columns[0])
    return cols


def plan_chunk(spec: PipelineSpec, batch: pa.RecordBatch, limit: TokenLimit | None = None) -> ChunkPlan:
    errors: list[str | None] = batch.column("_input_problem").to_pylist()
    empty = batch.column("_input_empty").to_numpy(zero_copy_only=False)
    sent = np.flatnonzero(~empty)
    kind = spec.task.kind
    if kind in ("embed", "classify", "generate"):
        texts = batch.column(text_column(spec)).take(pa.array(sent)).to_pylist()
        truncated = None
        if limit is not None:
            texts, sent, truncated = limit.apply(texts, sent, errors, batch.num_rows)
        inputs = texts if kind != "generate" else _conversations(spec, batch, sent, texts)
        return ChunkPlan(sent, inputs, errors, truncated)
    if kind == "predict":
        columns = spec.model_input_columns()  # never the evaluation label
        taken = batch.select(columns).take(pa.array(sent))
        return ChunkPlan(sent, {c: taken.column(c).to_pylist() for c in columns}, errors)
    images, ok = _load_images(spec, batch, sent, errors)
    return ChunkPlan(ok, images, errors)


def call_provider(provider: Any, spec: PipelineSpec, params: GenerationParams | None, inputs: Any) -> Any:
    """The loop's only call into a provider, for every task kind."""
    kind = spec.task.kind
    if kind == "embed":
        return provider.embed(inputs)
    if kind == "generate":
        return provider.generate(inputs, params)
    if kind == "classify":
        return provider.classify(inputs, spec.task.labels)
    if kind == "predict":
        return provider.predict(inputs)
    if kind == "embed_image":
        return provider.embed_images(inputs)
    return provider.classify_images(inputs, spec.task.labels)


def check_alignment(provider: Any, spec: PipelineSpec, sent: int, results: Any) -> None:
    """Exactly one result per row sent, for every task kind; anything else would attach outputs to the wrong rows."""
    where = f"{type(provider).__name__}.{method_name(spec)}"
    counts: dict[str, int]
    if isinstance(results, dict):
        counts = {name: _length(values) for name, values in results.items()}
    else:
        counts = {"": _length(results)}
    bad = {name: n for name, n in counts.items() if n != sent}
    if bad:
        detail = ", ".join(f"{n} for column {name!r}" if name else str(n) for name, n in bad.items())
        raise PipelineError(
            f"{where} returned {detail} results for {sent} rows: a provider must return exactly one result per row, "
            "in order; nothing was published",
            fix="fix the provider (a custom model class must return one output per input row); if it is a built-in "
            "provider, report a bug with this message",
        )


def _length(values: Any) -> int:
    if values is None:
        return 0
    shape = getattr(values, "shape", None)
    if shape is not None and len(shape) >= 1:
        return int(shape[0])
    return len(values)


def declared_output_types(spec: PipelineSpec, provider: Any) -> dict[str, pa.DataType | None]:
    """The output columns a task writes and their types, known before any row is inferred. None: the type comes
    from the model's values (predict without `task.output_types`; embeddings whose size the provider does not
    declare) and must be the same in every chunk."""
    types = _task_output_types(spec, provider)
    if truncates(spec):
        types[TRUNCATED_COLUMN] = pa.bool_()
    return types


def truncates(spec: PipelineSpec) -> bool:
    """Whether the output has the `input_truncated` flag column."""
    return spec.prepare.max_input_tokens is not None and spec.prepare.too_long == "truncate"


def _task_output_types(spec: PipelineSpec, provider: Any) -> dict[str, pa.DataType | None]:
    task = spec.task
    out = task.resolved_output_column()
    if task.kind in ("embed", "embed_image"):
        dim = _declared_dimensions(provider)
        return {out: pa.list_(pa.float32(), dim) if dim else None}
    if task.kind in ("classify", "classify_image"):
        return {out: pa.string(), "score": pa.float64()}
    if task.kind == "predict":
        # Without output_types the model names its columns; their types are the ones its chunks agree on.
        return {name: pa.type_for_alias(alias) for name, alias in (task.output_types or {}).items()}
    types: dict[str, pa.DataType | None] = {out: pa.string(), "prompt_tokens": pa.int64(),
                                            "completion_tokens": pa.int64()}
    if task.structured:
        from resources.structured import build_columns

        names, arrays = build_columns([], task.structured, task.structured_column)
        types.update({n: a.type for n, a in zip(names, arrays)})
    if task.labels:
        types[task.label_column] = pa.string()  # type: ignore[index]
    return types


def _declared_dimensions(provider: Any) -> int | None:
    try:
        dim = getattr(provider, "dimensions", None)
    except Exception:  # a property that needs the loaded model, used before load: unknown, not an error
        return None
    return dim if isinstance(dim, int) and dim > 0 else None


def output_columns(
    spec: PipelineSpec, plan: ChunkPlan, results: Any, n: int, stats: Any
) -> tuple[list[str], list[pa.Array]]:
    """The chunk's output columns (one value per row of the chunk, null where a row was not sent or failed), then
    `input_truncated` when inputs are cut to a limit; row errors from the results go into `plan.errors`."""
    names, arrays = _task_columns(spec, plan, results, n)
    if truncates(spec):
        names, arrays = [*names, TRUNCATED_COLUMN], [*arrays, pa.array(plan.truncated or [False] * n, pa.bool_())]
    return names, arrays


def _task_columns(spec: PipelineSpec, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
    kind, task, sent = spec.task.kind, spec.task, plan.sent
    out = task.resolved_output_column()
    if kind in ("embed", "embed_image"):
        return [out], [_vectors_column(results, sent, n)]
    if kind in ("classify", "classify_image"):
        for i, r in zip(sent, results):
            if r.error:
                plan.errors[i] = r.error
        labels = _scatter([r.label for r in results], sent, n)
        scores = _scatter([r.score for r in results], sent, n)
        return [out, "score"], [pa.array(labels, pa.string()), pa.array(scores, pa.float64())]
    if kind == "predict":
        return _predict_columns(spec, results, sent, n)
    return _generate_columns(spec, plan, results, n)


def _scatter(values: list[Any], sent: np.ndarray, n: int) -> list[Any]:
    # Alignment was checked before: len(values) == len(sent), so zip loses nothing.
    out: list[Any] = [None] * n
    for i, v in zip(sent.tolist(), values):
        out[i] = v
    return out


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


def _predict_columns(spec: PipelineSpec, results: Any, sent: np.ndarray, n: int):
    outputs = results if isinstance(results, dict) else {spec.task.resolved_output_column(): results}
    from batch_assets.spec import RESERVED_COLUMNS

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
            arrays.append(pa.array(_scatter(values, sent, n)))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise PipelineError(f"the model's output column {name!r} has values of mixed types: {exc}", column=name,
                                fix="return one type per output column") from None
    return list(outputs), arrays


def _conversations(spec: PipelineSpec, batch: pa.RecordBatch, sent: np.ndarray,
                   prompts: list[str]) -> list[list[dict[str, Any]]]:
    """One conversation per sent row; `prompts` are the sent rows' prompts, in order."""
    images = batch.column("_images").to_pylist() if "_images" in batch.schema.names else None
    system = [{"role": "system", "content": spec.prepare.system}] if spec.prepare.system else []
    conversations = []
    for i, prompt in zip(sent.tolist(), prompts):
        content: Any = prompt
        if images is not None and images[i]:
            from resources.multimodal import build_user_content

            content = build_user_content(prompt, images[i])
        conversations.append([*system, {"role": "user", "content": content}])
    return conversations


def _generate_columns(spec: PipelineSpec, plan: ChunkPlan, results: list[Any], n: int):
    task, sent, errors = spec.task, plan.sent, plan.errors
    for i, r in zip(sent.tolist(), results):
        if r.error:
            errors[i] = r.error
    texts = _scatter([r.text for r in results], sent, n)
    names = [task.resolved_output_column(), "prompt_tokens", "completion_tokens"]
    arrays = [pa.array(texts, pa.string()),
              pa.array(_scatter([r.prompt_tokens for r in results], sent, n), pa.int64()),
              pa.array(_scatter([r.completion_tokens for r in results], sent, n), pa.int64())]
    if task.structured:
        from batch_assets.stages.structured_columns import structured_columns

        s_names, s_arrays = structured_columns(spec, texts, errors)
        names += s_names
        arrays += s_arrays
    if task.labels:
        from batch_assets.stages.infer import normalize_label

        labels = [normalize_label(t, task.labels, task.default_label) if errors[i] is None else None
                  for i, t in enumerate(texts)]
        names.append(task.label_column)  # type: ignore[arg-type]
        arrays.append(pa.array(labels, pa.string()))
    return names, arrays


def _load_images(spec: PipelineSpec, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]):
    from resources.multimodal import load_image

    refs = batch.column(spec.prepare.image_columns[0]).to_pylist()
    images, ok = [], []
    for i in sent.tolist():
        try:
            images.append(load_image(refs[i], max_side=spec.prepare.image_max_side))
            ok.append(i)
        except Exception as exc:  # a bad image is that row's error, not the partition's
            errors[i] = f"image could not be read: {exc}"
    return images, np.asarray(ok, dtype=np.int64)


def same_failure(messages: list[str]) -> str | None:
    """The shared failure when every message is the same once row-specific details (numbers, quoted text) are
    dropped: the mark of a setup problem (endpoint down, every request refused), not of bad rows."""
    if not messages:
        return None
    squash = {re.sub(r"'[^']*'|\"[^\"]*\"|\d+(\.\d+)?", "#", m)[:120] for m in messages}
    return messages[0] if len(squash) == 1 else None
