"""One Task per task kind: the one place the pipeline decides what a `task.kind` reads, sends, gets back and writes.

`TASKS` is the table; nothing else in the package compares task kinds. Each kind is one small class:

| kind | class | module |
|---|---|---|
| embed, classify | `EmbedTask`, `ClassifyTask` | `text.py` |
| generate | `GenerateTask` | `generate.py` |
| predict | `PredictTask` | `predict.py` |
| embed_image, classify_image | `EmbedImageTask`, `ClassifyImageTask` | `image.py` |
| transcribe | `TranscribeTask` | `transcribe.py` |

What the kinds share (the chunk plan, the provider call, the alignment check) is in `base.py`; the vector and
label outputs of text and image tasks in `outputs.py`; the token limit on text inputs in `token_limits.py`. `task_type(spec)` answers what the spec alone tells (the
spec's cross-field check, preparation, previews, checkpoints); `task_for(spec, provider)` builds the Task the infer
loop asks, once per partition, with the generation params, the token limit and the declared output types.
"""

from __future__ import annotations

from typing import Any

from batch_assets.tasks.base import ERROR_COLUMN, RESERVED_COLUMNS, TRUNCATED_COLUMN, ChunkPlan, Spec, Task
from batch_assets.tasks.generate import GenerateTask, normalize_label
from batch_assets.tasks.image import ClassifyImageTask, EmbedImageTask
from batch_assets.tasks.predict import PredictTask
from batch_assets.tasks.text import ClassifyTask, EmbedTask
from batch_assets.tasks.token_limits import TokenLimit
from batch_assets.tasks.transcribe import TranscribeTask


TASKS: dict[str, type[Task]] = {
    task.kind: task
    for task in (EmbedTask, GenerateTask, ClassifyTask, PredictTask, EmbedImageTask, ClassifyImageTask, TranscribeTask)
}


def task_type(spec: Spec) -> type[Task]:
    """The class of the spec's task kind (its class methods need only the spec)."""
    return TASKS[spec.task.kind]


def task_for(spec: Spec, provider: Any) -> Task:
    """The partition's Task: the generation params and the token limit (which asks the provider's tokenizer) are
    settled here, once, before any row is sent."""
    cls = task_type(spec)
    params = cls.generation_params(spec)
    limit = None
    if cls.text_column is not None:
        limit = TokenLimit.for_run(spec, provider, params, cls.text_column, cls.user_column(spec))
    return cls(spec, provider, params, limit)


__all__ = ["ERROR_COLUMN", "RESERVED_COLUMNS", "TASKS", "TRUNCATED_COLUMN", "ChunkPlan", "Task", "normalize_label",
           "task_for", "task_type"]
