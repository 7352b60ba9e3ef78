"""embed and classify read one text per row (batch_assets/tasks/text.py): from `prepare.text_column` or a
`prepare.template` of several columns, never both and never neither (refused at spec load, naming the field);
the model gets exactly the prepared text of the rows that can be sent."""

from __future__ import annotations

import pytest

from batch_assets.tasks.text import ClassifyTask, EmbedTask
from tests.tasks.prepared import prepared, spec_for


@pytest.mark.parametrize(("prepare", "field"), [
    ({}, "prepare.text_column"),
    ({"text_column": "title", "template": "{title} {body}"}, "prepare.template"),
])
def test_the_text_comes_from_one_column_or_one_template(prepare, field):
    with pytest.raises(Exception, match=field.replace(".", r"\.")):
        spec_for({"kind": "embed"}, prepare, ["title", "body"])


def test_a_template_reads_every_column_it_names_and_messages_name_it_as_the_user_wrote_it():
    spec = spec_for({"kind": "classify", "labels": ["a", "b"]}, {"template": "{title}: {body}"}, ["title", "body"])
    assert ClassifyTask.source_columns(spec) == ["title", "body"] and ClassifyTask.model_input(spec) == ["_text"]
    assert ClassifyTask.user_column(spec) == "the text (prepare.template filled in)"
    plain = spec_for({"kind": "embed"}, {"text_column": "body"}, ["title", "body"])
    assert EmbedTask.source_columns(plain) == ["body"] and EmbedTask.user_column(plain) == "body"


def test_the_model_gets_the_prepared_text_of_the_rows_that_can_be_sent():
    spec = spec_for({"kind": "embed"}, {"text_column": "body"}, ["body"])
    batch = prepared({"body": [" raw ", None, "x"], "_text": ["Héllo wörld", "", "日本語"]},
                     [None, "empty input: column 'body' is empty", None])
    plan = EmbedTask(spec, provider=None).plan(batch)
    assert plan.sent.tolist() == [0, 2] and plan.inputs == ["Héllo wörld", "日本語"] and plan.truncated is None
