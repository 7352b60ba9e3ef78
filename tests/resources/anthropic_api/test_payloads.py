"""The pipeline's chat rows -> Anthropic Messages request bodies, and Messages -> a row's Generation
(resources/anthropic_api/payloads.py), the one mapping the online and the batch path share. Every body built here
is checked as Anthropic checks it (the stand-in's `check_params`: the SDK's `MessageCreateParamsNonStreaming`
fields, no system message inside `messages`, base64 images of an allowed media type, `output_config.format` a JSON
schema), and every answer is read from the SDK's own `Message` type."""

from __future__ import annotations

import base64
import json

import anthropic.types
import pytest

from batch_assets.resources.anthropic_api.payloads import message_generation, plan_messages, request_body
from batch_assets.resources.openai_api.payloads import UnsupportedConstraintError
from batch_assets.resources.protocols import GenerationParams
from tests.resources.anthropic_api.anthropic_standin import check_params

MODEL = "claude-standin"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n....").decode()


def body(conversation, params=GenerationParams(max_new_tokens=16), extra=None) -> dict:
    out = request_body(MODEL, conversation, plan_messages(params, extra or {}))
    assert check_params(out) is None, check_params(out)  # what Anthropic would refuse
    return out


def test_the_system_prompt_is_the_top_level_system_and_never_a_message():
    out = body([{"role": "system", "content": "Be brief."},
                {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
                {"role": "user", "content": "Hello"}])
    assert out["system"] == "Be brief.\n\nAnswer in French."
    assert out["messages"] == [{"role": "user", "content": "Hello"}]
    assert out["model"] == MODEL and out["max_tokens"] == 16
    assert "system" not in body([{"role": "user", "content": "no system"}])


def test_images_become_anthropic_image_blocks():
    out = body([{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]}])
    text, inline, linked = out["messages"][0]["content"]
    assert text == {"type": "text", "text": "What is this?"}
    assert inline == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    assert linked == {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}


def test_a_content_part_with_no_anthropic_form_fails_the_call_before_any_request():
    with pytest.raises(UnsupportedConstraintError, match="'file' content part.*prepare.documents"):
        request_body(MODEL, [{"role": "user", "content": [{"type": "file", "file": {"file_data": "x"}}]}],
                     plan_messages(GenerationParams(), {}))


def test_choices_travel_as_a_json_schema_with_room_for_the_longest_label():
    labels = ("technology", "financial services and insurance", "retail")
    plan = plan_messages(GenerationParams(max_new_tokens=1, choices=labels), {})
    out = body([{"role": "user", "content": "Acme Bank"}], GenerationParams(max_new_tokens=1, choices=labels))
    fmt = out["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["properties"]["label"]["enum"] == list(labels)
    assert out["max_tokens"] == plan.max_tokens > 1  # a 1-token budget would cut every label off
    assert plan.decode(json.dumps({"label": "retail"})) == "retail"


def test_a_json_schema_is_sent_closed_and_stop_strings_as_stop_sequences():
    schema = {"type": "object", "properties": {"name": {"type": "string", "minLength": 2}}, "required": ["name"]}
    out = body([{"role": "user", "content": "x"}], GenerationParams(json_schema=schema, stop=("\n\n",)))
    sent = out["output_config"]["format"]["schema"]
    assert sent["additionalProperties"] is False and sent["required"] == ["name"]
    assert out["stop_sequences"] == ["\n\n"]
    assert "temperature" not in out and "top_p" not in out  # the Messages API of SDK 2.x takes neither


@pytest.mark.parametrize(("params", "match"), [
    (GenerationParams(regex=r"\d+"), "regex.*cannot be sent to Anthropic"),
    (GenerationParams(choices=("a",), regex="a"), "at most one structured-output constraint"),
    (GenerationParams(choices=()), "`choices` is empty"),
])
def test_a_constraint_with_no_anthropic_form_is_refused_before_any_request(params, match):
    with pytest.raises(UnsupportedConstraintError, match=match):
        plan_messages(params, {})


def test_extra_fields_are_sent_but_never_override_the_completion_budget():
    plan = plan_messages(GenerationParams(max_new_tokens=32, extra={"max_tokens": 1, "top_k": 5}),
                         {"metadata": {"user_id": "u1"}})
    assert plan.body["max_tokens"] == 32 and plan.body["top_k"] == 5 and plan.body["metadata"] == {"user_id": "u1"}


def message(content: list[dict], stop_reason: str | None = "end_turn", usage: dict | None = None):
    return anthropic.types.Message.model_validate({
        "id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "content": content,
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": usage or {"input_tokens": 11, "output_tokens": 3}})


def test_an_answer_is_its_text_blocks_with_usage_and_why_it_stopped():
    answer = message([{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}])
    for form in (answer, answer.model_dump(mode="json")):  # the online SDK object, a batch result's JSON
        generation = message_generation(form, lambda text: text)
        assert (generation.text, generation.error) == ("Hello world", None)
        assert (generation.prompt_tokens, generation.completion_tokens) == (11, 3)
        assert generation.finish_reason == "stop"


def test_a_cut_off_answer_says_length_and_a_refusal_or_no_text_is_the_rows_error():
    cut = message_generation(message([{"type": "text", "text": "{\"la"}], "max_tokens"), lambda t: t)
    assert cut.finish_reason == "length" and cut.text == "{\"la"
    refused = message_generation(message([{"type": "text", "text": "I can't help with that."}], "refusal"),
                                 lambda t: t)
    assert refused.text is None and refused.error.startswith("the model refused (I can't help")
    empty = message_generation(message([], "end_turn"), lambda t: t)
    assert empty.text is None and empty.error == "the model returned no text (stop_reason=end_turn)"
    assert empty.prompt_tokens == 11  # still counted: it was paid for


def test_something_that_is_not_a_message_is_malformed_and_asked_again():
    from batch_assets.resources.openai_api.retry import MalformedResponse

    with pytest.raises(MalformedResponse, match="expected a Message"):
        message_generation({"type": "error", "error": {"type": "api_error"}}, lambda t: t)
