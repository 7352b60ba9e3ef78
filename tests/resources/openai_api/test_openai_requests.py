"""What the OpenAI-compatible provider sends for each kind of request, and how it reads server waits — no network."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.openai_api import OpenAICompatibleProvider, UnsupportedConstraintError
from batch_assets.resources.openai_api.payloads import choices_schema, plan_request
from batch_assets.resources.openai_api.retry import backoff_delay, redact, retry_after_seconds
from batch_assets.resources.protocols import GenerationParams

LABELS = ("Finance", "Retail", "Real Estate")


def plan(params: GenerationParams, **overrides):
    settings = dict(
        api="chat",
        backend="response_format",
        json_schema_mode="json_schema",
        max_tokens_param="max_tokens",
        extra_body={},
        store_responses=False,
    )
    settings.update(overrides)
    return plan_request(params, **settings)


def test_choices_as_openai_json_schema_and_back_to_the_label():
    p = plan(GenerationParams(max_new_tokens=2, choices=LABELS))
    fmt = p.kwargs["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"] == choices_schema(LABELS)
    # the JSON wrapper needs more than the 2 tokens a bare label would: the budget is raised, not left to cut it
    assert p.kwargs["max_tokens"] > 2
    assert p.decode('{"label": "Real Estate"}') == "Real Estate"
    assert p.decode('{"label": "Real Est') == '{"label": "Real Est'  # left for the pipeline's validation to report


def test_choices_in_llama_cpp_json_object_form():
    p = plan(GenerationParams(choices=LABELS), json_schema_mode="json_object_schema")
    assert p.kwargs["response_format"] == {"type": "json_object", "schema": choices_schema(LABELS)}


@pytest.mark.parametrize(
    ("backend", "constraint", "expected"),
    [
        ("vllm", {"choices": LABELS}, {"structured_outputs": {"choice": list(LABELS)}}),
        ("vllm", {"regex": r"\d{3}"}, {"structured_outputs": {"regex": r"\d{3}"}}),
        ("vllm", {"json_schema": {"type": "object"}}, {"structured_outputs": {"json": {"type": "object"}}}),
        ("vllm_legacy", {"choices": LABELS}, {"guided_choice": list(LABELS)}),
        ("vllm_legacy", {"regex": r"\d{3}"}, {"guided_regex": r"\d{3}"}),
        ("vllm_legacy", {"json_schema": {"type": "object"}}, {"guided_json": {"type": "object"}}),
    ],
)
def test_vllm_constraints_travel_in_extra_body(backend, constraint, expected):
    p = plan(GenerationParams(**constraint), backend=backend, extra_body={"top_k": 5})
    assert p.kwargs["extra_body"] == {"top_k": 5, **expected}
    assert "response_format" not in p.kwargs
    # vLLM answers with the bare label (or regex match, or JSON document): nothing is unwrapped, so text that only
    # looks like the response_format wrapper reaches validation as sent, never read as a label
    assert p.decode('{"label": "Retail"}') == '{"label": "Retail"}'


def test_regex_on_a_response_format_endpoint_is_refused_with_the_fix():
    with pytest.raises(UnsupportedConstraintError, match="constraint_backend='vllm'"):
        plan(GenerationParams(regex=r"[A-Z]+"))


def test_json_schema_on_the_responses_api_and_its_minimum_budget():
    schema = {"title": "Company info", "type": "object", "properties": {"x": {"type": "integer"}}}
    p = plan(GenerationParams(max_new_tokens=4, json_schema=schema), api="responses")
    # strict mode takes every property as required: the optional x goes as required and nullable
    sent = {"title": "Company info", "type": "object", "required": ["x"],
            "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}
    assert p.kwargs["text"] == {
        "format": {"type": "json_schema", "name": "Company_info", "schema": sent, "strict": True}
    }
    assert p.kwargs["max_output_tokens"] == 16
    assert p.kwargs["store"] is False
    with pytest.raises(UnsupportedConstraintError, match="stop"):
        plan(GenerationParams(stop=("\n",)), api="responses")


def test_sampling_settings_and_pass_through():
    p = plan(
        GenerationParams(max_new_tokens=9, temperature=0.3, top_p=0.9, stop=("\n",), seed=7, extra={"top_k": 2}),
        max_tokens_param="max_completion_tokens",
        extra_body={"top_k": 40, "min_p": 0.1},
    )
    assert p.kwargs["max_completion_tokens"] == 9 and "max_tokens" not in p.kwargs
    assert p.kwargs["stop"] == ["\n"] and p.kwargs["seed"] == 7
    assert p.kwargs["extra_body"] == {"top_k": 2, "min_p": 0.1}  # the call's params win over the resource's


def test_retry_after_forms():
    assert retry_after_seconds({"retry-after": "2"}) == 2
    assert retry_after_seconds({"retry-after": "0.5"}) == 0.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= retry_after_seconds({"retry-after": date}, now=now) <= 31
    assert retry_after_seconds({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}, now=now) == 0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None


def test_backoff_grows_is_capped_and_jittered():
    rng = random.Random(0)
    waits = [[backoff_delay(a, 1.0, 8.0, rng) for _ in range(200)] for a in (1, 2, 3, 4, 5)]
    for attempt, samples in zip((1, 2, 3, 4, 5), waits):
        step = min(8.0, 2 ** (attempt - 1))
        assert all(step / 2 <= w <= step for w in samples)
        assert len(set(samples)) > 1  # jittered, not one value
    assert max(waits[4]) <= 8.0


def test_redact_removes_the_key_and_key_shaped_text():
    key = "sk-proj-abcdef0123456789"
    assert key not in redact(f"Incorrect API key provided: {key}.", key)
    assert "sk-live-999" not in redact("key sk-live-9999999 rejected", None)


def test_no_key_for_api_openai_com_is_a_load_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelLoadError, match="OPENAI_API_KEY"):
        OpenAICompatibleProvider(model="gpt-4o-mini").load_for_tests()


def test_invalid_settings_are_named():
    with pytest.raises(ModelLoadError, match="max_concurrency=0"):
        OpenAICompatibleProvider(model="m", base_url="http://127.0.0.1:9/v1", max_concurrency=0).load_for_tests()
