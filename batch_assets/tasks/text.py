"""embed and classify: one text per row, from `prepare.text_column` or a `prepare.template` of several columns."""

from __future__ import annotations


import numpy as np
import pyarrow as pa

from batch_assets.tasks.base import ChunkPlan, Problems, Spec, Task
from batch_assets.tasks.outputs import Labels, Vectors



class TextInput(Task):
    """The model reads `_text`, cut to the token limit when the spec sets one."""

    reads = "text"
    text_column = "_text"
    prepare_fields = frozenset({"text_column", "template", "documents"})

    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        problems = super().spec_problems(spec)
        prep = spec.prepare
        if not (prep.text_column or prep.template):
            problems.append(("prepare.text_column", f"task {cls.kind!r} needs the column holding the text (or "
                             "prepare.template to make the text of several columns)"))
        if prep.text_column and prep.template:
            problems.append(("prepare.template", f"task {cls.kind!r} reads text_column or template, not both"))
        return problems

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        prep = spec.prepare
        return [prep.text_column] if prep.text_column else prep.template_fields()

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        return ["_text"]

    @classmethod
    def user_column(cls, spec: Spec) -> str:
        """What the user calls the limited text, for messages."""
        if spec.prepare.template:
            return "the text (prepare.template filled in)"
        return str(spec.prepare.text_column)

    def _plan(self, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]) -> ChunkPlan:
        texts = batch.column(self.text_column).take(pa.array(sent)).to_pylist()
        truncated = None
        if self.limit is not None:
            texts, sent, truncated = self.limit.apply(texts, sent, errors, batch.num_rows)
        return ChunkPlan(sent, self._inputs(batch, sent, texts), errors, truncated)

    def _inputs(self, batch: pa.RecordBatch, sent: np.ndarray, texts: list[str]) -> object:
        return texts


class EmbedTask(TextInput, Vectors):
    kind = "embed"


class ClassifyTask(TextInput, Labels):
    kind = "classify"
