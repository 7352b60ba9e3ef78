"""generate: a conversation per row (the system prompt, then `prepare.template` filled in, with images when the
spec names image columns), a text per row back; optionally normalised to `task.labels` or validated against
`task.structured`."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.tasks.base import ChunkPlan, Problems, Spec, note_row_errors, scatter
from batch_assets.tasks.text import TextInput
from batch_assets.resources.multimodal import build_user_content
from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import build_columns, validate_output



class GenerateTask(TextInput):
    kind = "generate"
    default_output = "generated_text"
    reads = "prompt"
    text_column = "_prompt"
    prepare_fields = frozenset({"template", "system", "image_columns", "image_max_side", "documents",
                                "file_columns"})
    task_fields = frozenset({"params", "labels", "label_column", "default_label", "structured_column"})
    counts_tokens = True
    extra_outputs = ("prompt_tokens", "completion_tokens")
    structured = True

    @classmethod
    def generation_params(cls, spec: Spec) -> GenerationParams:
        p = spec.task.params
        constraints = spec.task.structured.generation_constraints() if spec.task.structured else {}
        return GenerationParams(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_p=p.top_p,
                                stop=tuple(p.stop), seed=p.seed, **constraints)

    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        problems = super(TextInput, cls).spec_problems(spec)  # a prompt template, not TextInput's text column
        task = spec.task
        if not spec.prepare.template:
            problems.append(("prepare.template", "task 'generate' needs a prompt template"))
        if task.labels is not None and not task.label_column:
            problems.append(("task.label_column", "labels are given: name the column for the normalised label"))
        return problems

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        prep = spec.prepare
        return prep.template_fields() + [c for c in [*prep.image_columns, *prep.file_columns]
                                         if c not in prep.template_fields()]

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        return (["_prompt"] + (["_images"] if spec.prepare.image_columns else [])
                + (["_files"] if spec.prepare.file_columns else []))

    @classmethod
    def user_column(cls, spec: Spec) -> str:
        return "the prompt (prepare.template filled in)"

    @classmethod
    def produced(cls, spec: Spec) -> set[str]:
        return super().produced(spec) | {spec.task.label_column or ""}

    @classmethod
    def prediction_column(cls, spec: Spec) -> str | None:
        task = spec.task
        if task.structured is not None and not task.structured.unnest:
            return task.structured_column
        return task.label_column or task.resolved_output_column()

    @classmethod
    def predicted_labels(cls, spec: Spec) -> tuple[str, list[str]] | None:
        task = spec.task
        structured = task.structured
        if structured is not None and structured.choices is not None and not structured.unnest:
            return task.structured_column, list(structured.choices)
        if task.labels and task.label_column:
            return task.label_column, list(task.labels)
        return None

    def _inputs(self, batch: pa.RecordBatch, sent: np.ndarray, prompts: list[str]) -> list[list[dict[str, Any]]]:
        """One conversation per sent row; `prompts` are the sent rows' prompts, in order."""
        images = batch.column("_images").to_pylist() if "_images" in batch.schema.names else None
        files = batch.column("_files").to_pylist() if "_files" in batch.schema.names else None
        system = [{"role": "system", "content": self.spec.prepare.system}] if self.spec.prepare.system else []
        conversations = []
        for i, prompt in zip(sent.tolist(), prompts):
            content: Any = prompt
            if (images is not None and images[i]) or (files is not None and files[i]):
                content = build_user_content(prompt, images[i] if images else [], files=files[i] if files else ())
            conversations.append([*system, {"role": "user", "content": content}])
        return conversations

    def _call_args(self) -> tuple[Any, ...]:
        return (self.params,)

    def _columns(self, plan: ChunkPlan, results: Any, n: int) -> tuple[list[str], list[pa.Array]]:
        task, sent, errors = self.spec.task, plan.sent, plan.errors
        results = results or []  # None: no row of the chunk was sent (every input empty or unreadable)
        note_row_errors(results, sent, errors)
        texts = scatter([r.text for r in results], sent, n)
        names = [self.output_column, "prompt_tokens", "completion_tokens"]
        arrays = [pa.array(texts, pa.string()),
                  pa.array(scatter([r.prompt_tokens for r in results], sent, n), pa.int64()),
                  pa.array(scatter([r.completion_tokens for r in results], sent, n), pa.int64())]
        if task.structured:
            finish = scatter([getattr(r, "finish_reason", None) for r in results], sent, n)
            s_names, s_arrays = self._structured_columns(texts, errors, finish)
            names += s_names
            arrays += s_arrays
        if task.labels:
            labels = [normalize_label(t, task.labels, task.default_label) if errors[i] is None else None
                      for i, t in enumerate(texts)]
            names.append(task.label_column)  # type: ignore[arg-type]
            arrays.append(pa.array(labels, pa.string()))
        return names, arrays

    def _structured_columns(self, texts: list[str | None], errors: list[str | None],
                            finish_reasons: list[str | None]) -> tuple[list[str], list[pa.Array]]:
        """Validate each row's text against `task.structured`; failures become row errors (the text stays in the
        output column), successes a struct/string column or, with `unnest`, one column per property."""
        structured = self.spec.task.structured
        values = []
        for i, text in enumerate(texts):
            if errors[i] is not None:
                values.append(None)
                continue
            value, problem = validate_output(text, structured, finish_reasons[i])
            if problem is not None:
                errors[i] = problem
            values.append(value)
        return build_columns(values, structured, self.spec.task.structured_column)

    def _schema(self) -> dict[str, pa.DataType | None]:
        task = self.spec.task
        types: dict[str, pa.DataType | None] = {self.output_column: pa.string(), "prompt_tokens": pa.int64(),
                                                "completion_tokens": pa.int64()}
        if task.structured:
            names, arrays = build_columns([], task.structured, task.structured_column)
            types.update({n: a.type for n, a in zip(names, arrays)})
        if task.labels:
            types[task.label_column] = pa.string()  # type: ignore[index]
        return types


def normalize_label(text: str | None, labels: list[str], default: str) -> str:
    """Map free text to one of `labels`: an exact match (ignoring case and punctuation), else the label that
    appears first in the text, else `default`."""
    if not text:
        return default
    squash = lambda s: re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()  # noqa: E731
    answer = squash(text)
    by_norm = {squash(label): label for label in labels}
    if answer in by_norm:
        return by_norm[answer]
    best: tuple[int, str] | None = None
    for norm, label in by_norm.items():
        m = re.search(rf"\b{re.escape(norm)}\b", answer)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), label)
    return best[1] if best else default
