"""The two outputs text and image tasks share (batch_assets/tasks/outputs.py): an embedding vector per row, or a
label with its score. What a user depends on: each answer lands on its own row when some rows were not sent, a row
the model could not answer is null with its error, the column's type is the declared one in every chunk (an empty
chunk included), and a provider returning the wrong shape is refused before anything is written."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.resources.protocols import Classification
from batch_assets.tasks.text import ClassifyTask, EmbedTask
from tests.tasks.prepared import prepared, spec_for

TEXTS = ["alpha", "", "gamma", "delta"]
FLAGS = [None, "empty input: column 'text' is empty", None, None]


class FixedSizeEmbedder:
    """Stand-in for an embedder that declares its vector size (as every built-in one does), or does not (None)."""

    def __init__(self, dimensions: int | None):
        self.dimensions = dimensions

    def vector_dimensions(self) -> int | None:
        return self.dimensions


def embed_task(dimensions: int | None = 3) -> EmbedTask:
    spec = spec_for({"kind": "embed"}, {"text_column": "text"}, ["text"])
    return EmbedTask(spec, FixedSizeEmbedder(dimensions))


def classify_task() -> ClassifyTask:
    spec = spec_for({"kind": "classify", "labels": ["pos", "neg"]}, {"text_column": "text"}, ["text"])
    return ClassifyTask(spec, provider=None)


def chunk() -> pa.RecordBatch:
    return prepared({"text": TEXTS, "_text": TEXTS}, FLAGS)


def test_each_vector_lands_on_its_own_row_and_an_unsent_row_is_null():
    t = embed_task()
    plan = t.plan(chunk())
    assert plan.sent.tolist() == [0, 2, 3] and plan.inputs == ["alpha", "gamma", "delta"]
    vectors = np.array([[1, 1, 1], [3, 3, 3], [4, 4, 4]], dtype=np.float64)  # float64 from a custom model
    names, [column] = t.columns(plan, vectors, 4)
    assert names == ["embedding"] and column.type == t.schema()["embedding"] == pa.list_(pa.float32(), 3)
    assert column.to_pylist() == [[1, 1, 1], None, [3, 3, 3], [4, 4, 4]]


def test_every_row_sent_is_one_vector_per_row_in_order():
    t = embed_task()
    batch = prepared({"text": ["a", "b"], "_text": ["a", "b"]})
    plan = t.plan(batch)
    _, [column] = t.columns(plan, np.arange(6, dtype=np.float32).reshape(2, 3), 2)
    assert column.to_pylist() == [[0, 1, 2], [3, 4, 5]] and column.null_count == 0


def test_a_chunk_with_no_row_sent_is_null_vectors_of_the_declared_type():
    t = embed_task(dimensions=384)
    batch = prepared({"text": ["", None], "_text": ["", ""]}, ["empty", "empty"])
    plan = t.plan(batch)
    _, [column] = t.columns(plan, None, 2)
    # the partition's writer casts each chunk to the declared type: an all-null chunk must take it
    assert column.cast(t.schema()["embedding"]).to_pylist() == [None, None]


def test_a_provider_that_declares_no_size_leaves_the_type_to_its_vectors():
    assert embed_task(dimensions=None).schema() == {"embedding": None}


def test_vectors_of_the_wrong_shape_are_refused_before_anything_is_written():
    t = embed_task()
    plan = t.plan(chunk())
    with pytest.raises(PipelineError, match=r"array of shape \(3,\); expected \(rows, dimensions\)"):
        t.columns(plan, np.array([1.0, 2.0, 3.0]), 4)
    with pytest.raises(PipelineError, match="2 results for 3 rows"):
        t.check(len(plan.sent), np.zeros((2, 3)))


def test_labels_and_scores_land_on_their_rows_and_a_failed_row_keeps_its_error():
    t = classify_task()
    plan = t.plan(chunk())
    results = [Classification("pos", 0.9), Classification(None, None, error="the model returned no label"),
               Classification("neg", 0.6)]
    names, arrays = t.columns(plan, results, 4)
    assert names == ["label", "score"] and {n: a.type for n, a in zip(names, arrays)} == t.schema()
    assert arrays[0].to_pylist() == ["pos", None, None, "neg"]
    assert arrays[1].to_pylist() == [0.9, None, None, 0.6]
    assert plan.errors == [None, FLAGS[1], "the model returned no label", None]


def test_a_label_chunk_with_no_row_sent_is_typed_nulls():
    t = classify_task()
    batch = prepared({"text": [None], "_text": [""]}, ["empty"])
    names, arrays = t.columns(t.plan(batch), None, 1)
    assert [a.type for a in arrays] == [pa.string(), pa.float64()] and all(a.null_count == 1 for a in arrays)


def test_classify_sends_the_candidate_labels_with_the_texts():
    seen: list[tuple[Sequence[str], Sequence[str]]] = []

    class RecordingClassifier:
        def classify(self, texts, labels):
            seen.append((list(texts), list(labels)))
            return [Classification(labels[0], 1.0) for _ in texts]

    spec = spec_for({"kind": "classify", "labels": ["pos", "neg"]}, {"text_column": "text"}, ["text"])
    t = ClassifyTask(spec, RecordingClassifier())
    plan = t.plan(chunk())
    t.call(plan.inputs)
    assert seen == [(["alpha", "gamma", "delta"], ["pos", "neg"])]


def test_a_spec_without_candidate_labels_is_refused_naming_the_field():
    with pytest.raises(Exception, match="task.labels"):
        spec_for({"kind": "classify"}, {"text_column": "text"}, ["text"])
