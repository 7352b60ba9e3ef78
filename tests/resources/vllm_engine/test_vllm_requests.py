"""batch_assets.resources.vllm_engine.requests: GenerationParams -> vLLM SamplingParams, prefix ordering, outputs -> rows.

These use vLLM's real SamplingParams / StructuredOutputsParams when vllm is importable, else the look-alikes in
tests/resources/vllm_engine/vllm_standin.py (same field names as vLLM 0.33).
"""

from __future__ import annotations

import random

import pytest

from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import StructuredOutput
from batch_assets.resources.vllm_engine.api import VLLMApi
from batch_assets.resources.vllm_engine.requests import prefix_order, sampling_params, structured_outputs_params, to_generation
from tests.resources.vllm_engine.vllm_standin import (
    StandInCompletionOutput,
    StandInRequestOutput,
    standin_vllm_api,
)


@pytest.fixture(scope="module")
def api() -> VLLMApi:
    return standin_vllm_api()


def constraint_of(api: VLLMApi, sp):
    return getattr(sp, api.structured_field)


def test_greedy_sampling_params(api):
    sp = sampling_params(api, GenerationParams(max_new_tokens=12, temperature=0.0, top_p=0.5, stop=("\n",), seed=7))
    assert isinstance(sp, api.SamplingParams)
    assert sp.max_tokens == 12 and sp.temperature == 0.0 and sp.top_p == 1.0  # top_p means nothing when greedy
    assert list(sp.stop) == ["\n"] and sp.seed == 7
    assert constraint_of(api, sp) is None


def test_sampled_params_and_extra_fields(api):
    params = GenerationParams(temperature=0.7, top_p=0.9, extra={"top_k": 20, "repetition_penalty": 1.1})
    sp = sampling_params(api, params)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.repetition_penalty) == (0.7, 0.9, 20, 1.1)


@pytest.mark.parametrize("extra", [{"max_tokens": 5}, {"not_a_field": 1}, {"structured_outputs": None}])
def test_extra_cannot_override_or_invent_fields(api, extra):
    with pytest.raises(ValueError, match="cannot be passed to vLLM's SamplingParams"):
        sampling_params(api, GenerationParams(extra=extra))


def test_choice_regex_and_json_become_structured_outputs(api):
    choice = constraint_of(api, sampling_params(api, GenerationParams(choices=("yes", "no"))))
    assert isinstance(choice, api.StructuredOutputsParams)
    assert choice.choice == ["yes", "no"] and choice.regex is None and choice.json is None

    regex = constraint_of(api, sampling_params(api, GenerationParams(regex=r"\d+")))
    assert regex.regex == r"\d+" and regex.choice is None

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    json_params = constraint_of(api, sampling_params(api, GenerationParams(json_schema=schema)))
    assert json_params.json == schema
    assert json_params.disable_any_whitespace is True
    assert structured_outputs_params(api, GenerationParams(json_schema=schema), True).disable_any_whitespace is False
    assert structured_outputs_params(api, GenerationParams()) is None


def test_prefix_order_groups_shared_prefixes_and_is_a_permutation():
    systems = ["You label industries.", "You summarise.", "You translate to French."]
    rng = random.Random(3)
    conversations = [
        [{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": f"row {i}"}]
        for i in range(30)
    ]
    order = prefix_order(conversations)
    assert sorted(order) == list(range(30))
    seen_systems = [conversations[i][0]["content"] for i in order]
    # each system prompt forms one contiguous run
    runs = [s for k, s in enumerate(seen_systems) if k == 0 or seen_systems[k - 1] != s]
    assert sorted(runs) == sorted(set(seen_systems))


def test_prefix_order_handles_multimodal_content_and_missing_system():
    conversations = [
        [{"role": "user", "content": [{"type": "text", "text": "b"}]}],
        [{"role": "user", "content": "a"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
    ]
    assert sorted(prefix_order(conversations)) == [0, 1, 2]


def output(text: str, finish: str = "stop", prompt_tokens: int = 5) -> StandInRequestOutput:
    completion = StandInCompletionOutput(0, text, [1, 2, 3], finish_reason=finish)
    return StandInRequestOutput("0", "p", list(range(prompt_tokens)), [completion])


def test_to_generation_free_text_keeps_length_cut_output():
    g = to_generation(output("a long answer that was cut", finish="length"), GenerationParams(max_new_tokens=3), None)
    assert (g.text, g.error, g.prompt_tokens, g.completion_tokens) == ("a long answer that was cut", None, 5, 3)


def test_to_generation_validates_structured_rows():
    s = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    params = GenerationParams(max_new_tokens=3, **s.generation_constraints())
    good = to_generation(output('{"a": 1}'), params, s)
    assert good.parsed == {"a": 1} and good.error is None

    cut = to_generation(output('{"a', finish="length"), params, s)
    assert cut.text == '{"a' and cut.parsed is None and "max_new_tokens=3" in cut.error

    labels = StructuredOutput(choices=["x", "y"])
    wrong = to_generation(output("z"), GenerationParams(choices=("x", "y")), labels)
    assert wrong.text == "z" and "not one of the labels" in wrong.error


def test_to_generation_reports_aborted_and_empty_requests():
    aborted = to_generation(output("part", finish="abort"), GenerationParams(), None)
    assert aborted.error == "vLLM aborted this request" and aborted.text == "part"
    empty = StandInRequestOutput("0", "p", [1], [])
    assert to_generation(empty, GenerationParams(), None).error == "vLLM returned no completion for this row"
