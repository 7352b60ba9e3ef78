"""predict (batch_assets/tasks/predict.py): the user's model class gets the input columns of the rows that can be
sent (never the evaluation label) and returns one column or several; what comes back is written one value per row,
or refused with an error naming the column before anything is published: a name the pipeline already uses, columns
other than the declared ones, values of mixed types. A chunk with no row to send is written with null outputs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from batch_assets.errors import PipelineError
from batch_assets.tasks.predict import PredictTask
from tests.tasks.prepared import prepared, spec_for

COLUMNS = ["age", "income", "label"]


def task(**task_fields) -> PredictTask:
    spec = spec_for({"kind": "predict", **task_fields}, {"input_columns": ["age", "income"]}, COLUMNS)
    return PredictTask(spec, provider=None)


def chunk(problems=None) -> pa.RecordBatch:
    return prepared({"age": [31, None, 45], "income": [1.5, 2.0, None], "label": ["a", "b", "c"]}, problems)


def test_the_model_gets_the_input_columns_of_the_rows_that_can_be_sent_and_never_the_label():
    spec = spec_for({"kind": "predict"}, {}, COLUMNS, evaluation={"label_column": "label"})
    plan = PredictTask(spec, provider=None).plan(chunk([None, "income: 'x' is not a number", None]))
    assert plan.sent.tolist() == [0, 2]
    assert plan.inputs == {"age": [31, 45], "income": [1.5, None]}  # nulls pass through as None, not NaN


def test_one_output_column_or_several_one_value_per_row_null_where_a_row_was_not_sent():
    t = task()
    plan = t.plan(chunk([None, "flagged", None]))
    names, arrays = t.columns(plan, np.array([0.25, 0.75]), 3)
    assert names == ["prediction"] and arrays[0].to_pylist() == [0.25, None, 0.75]
    names, arrays = t.columns(plan, {"score": [1, 2], "band": ["low", "high"]}, 3)
    assert names == ["score", "band"]
    assert [a.to_pylist() for a in arrays] == [[1, None, 2], ["low", None, "high"]]


def test_declared_types_are_known_before_any_row_and_other_columns_are_refused():
    t = task(output_types={"score": "double", "band": "string"})
    assert t.schema() == {"score": pa.float64(), "band": pa.string()}
    plan = t.plan(chunk())
    with pytest.raises(PipelineError, match=r"returned columns \['score'\].*declares \['band', 'score'\]"):
        t.columns(plan, {"score": [1.0, 2.0, 3.0]}, 3)


@pytest.mark.parametrize("name", ["income", "row_id", "error", "_input_empty"])
def test_an_output_named_like_an_input_or_a_pipeline_column_is_refused_naming_it(name):
    t = task()
    plan = t.plan(chunk())
    with pytest.raises(PipelineError, match=f"model returned column.*{name}") as caught:
        t.columns(plan, {name: [1, 2, 3]}, 3)
    assert caught.value.column == name


def test_values_of_mixed_types_are_refused_naming_the_column():
    t = task()
    plan = t.plan(chunk())
    with pytest.raises(PipelineError, match="'prediction' has values of mixed types") as caught:
        t.columns(plan, [1, "two", 3.0], 3)
    assert caught.value.column == "prediction"


def test_a_chunk_with_no_row_to_send_is_written_with_null_outputs_of_the_declared_types():
    """Every row flagged (e.g. values that did not convert at read): nothing is sent and the loop hands the task no
    results (None); the chunk still gets one output row per input row (it used to fail with a TypeError)."""
    reasons = ["age: 'x' is not a number"] * 3
    t = task(output_types={"score": "double", "band": "string"})
    plan = t.plan(chunk(reasons))
    assert len(plan.sent) == 0
    names, arrays = t.columns(plan, None, 3)
    assert names == ["score", "band"] and [a.type for a in arrays] == [pa.float64(), pa.string()]
    assert all(a.null_count == 3 for a in arrays) and plan.errors == reasons

    undeclared = task()
    names, arrays = undeclared.columns(undeclared.plan(chunk(reasons)), None, 3)
    assert names == ["prediction"] and arrays[0].null_count == 3
