"""What every task kind shares (batch_assets/tasks/base.py): rows flagged in preparation are not sent, exactly one
result per sent row or the chunk is refused naming provider, method, column and counts, results are scattered back
to their own rows, and a spec setting the task would silently ignore is refused at load naming the field."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.tasks import TRUNCATED_COLUMN
from batch_assets.tasks.base import ChunkPlan, scatter
from batch_assets.tasks.predict import PredictTask
from batch_assets.tasks.text import EmbedTask
from tests.tasks.prepared import prepared, spec_for


class CustomModel:
    """Stand-in for a user's model class (provider: custom) that returns several columns."""


def predict_task() -> PredictTask:
    return PredictTask(spec_for({"kind": "predict"}, {"input_columns": ["x"]}, ["x"]), CustomModel())


def test_a_result_count_that_is_not_one_per_row_is_refused_naming_provider_method_and_column():
    t = predict_task()
    with pytest.raises(PipelineError, match=r"CustomModel\.predict returned 2 for column 'b' results for 3 rows") \
            as caught:
        t.check(3, {"a": [1, 2, 3], "b": np.array([1, 2])})
    assert "nothing was published" in str(caught.value) and "one output per input row" in caught.value.fix
    with pytest.raises(PipelineError, match="returned 4 results for 3 rows"):
        t.check(3, [1, 2, 3, 4])
    t.check(0, None)  # nothing sent, nothing back
    t.check(2, np.zeros((2, 5)))  # rows are the first axis of an array


def test_results_are_scattered_back_to_their_own_rows():
    assert scatter(["a", "b"], np.array([1, 3]), 5) == [None, "a", None, "b", None]
    assert scatter([], np.array([], dtype=np.int64), 2) == [None, None]


def test_a_flagged_row_is_not_sent_and_keeps_its_reason():
    t = predict_task()
    plan = t.plan(prepared({"x": [1, 2, 3]}, [None, "x: 'two' is not a number", None]))
    assert plan.sent.tolist() == [0, 2] and plan.inputs == {"x": [1, 3]}
    assert plan.errors == [None, "x: 'two' is not a number", None]


@pytest.mark.parametrize(("task", "prepare", "field"), [
    ({"kind": "embed"}, {"text_column": "x", "image_columns": ["x"]}, "prepare.image_columns"),
    ({"kind": "predict"}, {"input_columns": ["x"], "template": "{x}"}, "prepare.template"),
    ({"kind": "embed"}, {"text_column": "x", "too_long": "fail"}, "prepare.too_long"),
    ({"kind": "embed", "structured": {"schema": {"type": "object"}}}, {"text_column": "x"}, "task.structured"),
    ({"kind": "predict"}, {"input_columns": ["x"], "max_input_tokens": 10}, "prepare.max_input_tokens"),
    ({"kind": "generate", "label_column": "lbl"}, {"template": "{x}"}, "task.label_column"),
])
def test_a_setting_the_task_would_ignore_is_refused_naming_the_field(task, prepare, field):
    with pytest.raises(Exception, match=field.replace(".", r"\.")):
        spec_for(task, prepare, ["x"])


def test_a_setting_left_at_its_default_is_no_setting():
    spec_for({"kind": "embed"}, {"text_column": "x", "too_long": "truncate"}, ["x"])  # the default, spelled out


class TwoDimEmbedder:
    """Stand-in for an embedder of 2-number vectors."""

    def vector_dimensions(self) -> int:
        return 2


def test_truncated_inputs_are_flagged_in_their_own_column():
    spec = spec_for({"kind": "embed"}, {"text_column": "x", "max_input_tokens": 3, "too_long": "truncate"}, ["x"])
    t = EmbedTask(spec, TwoDimEmbedder())
    assert t.truncates and t.schema()[TRUNCATED_COLUMN] == pa.bool_()
    plan = ChunkPlan(np.array([0, 1]), ["a b c", "d e f"], [None, None], truncated=[False, True])
    names, arrays = t.columns(plan, np.zeros((2, 2)), 2)
    assert names == ["embedding", TRUNCATED_COLUMN] and arrays[1].to_pylist() == [False, True]
