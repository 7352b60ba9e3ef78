"""embed_image and classify_image: one image per row, from the one `prepare.image_columns` column."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.tasks.base import ChunkPlan, Problems, Spec, Task
from batch_assets.tasks.outputs import Labels, Vectors
from batch_assets.resources.multimodal import load_image
from batch_assets.storage import filesystem_for

READ_THREADS = 4  # images fetched and decoded at once within a chunk (Pillow's decoders release the GIL)


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
        rows = sent.tolist()
        # One S3 client for the chunk, the storage layer's (a new one per image cost about a second each on a loaded
        # machine); the files are fetched and decoded on a few threads, as S3 reads wait on the network.
        s3 = filesystem_for("s3://")[0] if any(isinstance(refs[i], str) and refs[i].startswith("s3://")
                                               for i in rows) else None

        def one(i: int) -> Any:
            try:
                return load_image(refs[i], max_side=self.spec.prepare.image_max_side, s3=s3)
            except Exception as exc:  # a bad image is that row's error, not the partition's
                return exc

        if len(rows) > 1:
            with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(rows))) as pool:
                loaded = list(pool.map(one, rows))
        else:
            loaded = [one(i) for i in rows]
        images: list[Any] = []
        ok = []
        for i, image in zip(rows, loaded):
            if isinstance(image, Exception):
                errors[i] = f"image could not be read: {image}"
            else:
                images.append(image)
                ok.append(i)
        return ChunkPlan(np.asarray(ok, dtype=np.int64), images, errors)


class EmbedImageTask(ImageInput, Vectors):
    kind = "embed_image"


class ClassifyImageTask(ImageInput, Labels):
    kind = "classify_image"
