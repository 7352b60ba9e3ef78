"""embed_image and classify_image: one image per row, from the one `prepare.image_columns` column."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.tasks.base import ChunkPlan, Problems, Spec, Task
from batch_assets.tasks.outputs import Labels, Vectors
from batch_assets.resources.multimodal import load_image



class ImageInput(Task):
    """The model reads the decoded images; a row whose image cannot be read gets that as its error."""

    reads = "image"
    prepare_fields = frozenset({"image_columns", "image_max_side"})

    @classmethod
    def spec_problems(cls, spec: Spec) -> Problems:
        problems = super().spec_problems(spec)
        if len(spec.prepare.image_columns) != 1:
            problems.append(("prepare.image_columns", f"task {cls.kind!r} needs exactly one image column"))
        return problems

    @classmethod
    def source_columns(cls, spec: Spec) -> list[str]:
        return list(spec.prepare.image_columns)

    @classmethod
    def model_input(cls, spec: Spec) -> list[str]:
        return [spec.prepare.image_columns[0]]

    def _plan(self, batch: pa.RecordBatch, sent: np.ndarray, errors: list[str | None]) -> ChunkPlan:
        refs = batch.column(self.spec.prepare.image_columns[0]).to_pylist()
        images: list[Any] = []
        ok = []
        for i in sent.tolist():
            try:
                images.append(load_image(refs[i], max_side=self.spec.prepare.image_max_side))
                ok.append(i)
            except Exception as exc:  # a bad image is that row's error, not the partition's
                errors[i] = f"image could not be read: {exc}"
        return ChunkPlan(np.asarray(ok, dtype=np.int64), images, errors)


class EmbedImageTask(ImageInput, Vectors):
    kind = "embed_image"


class ClassifyImageTask(ImageInput, Labels):
    kind = "classify_image"
