"""Constrained decoding (xgrammar) in TransformersGenerator with the real SmolLM2-135M on CPU.

The model is small and often wrong; these tests check the constraint, not the answer: every label is one of the
choices, every JSON output parses and validates, and a budget too small for the schema gives row errors with the
raw text kept instead of failing the call.
"""

from __future__ import annotations

import json

import pytest

from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import StructuredOutput, arrow_type_for, validate_output

pytestmark = pytest.mark.slow

LABELS = ("positive", "negative", "neutral")
REVIEWS = [
    "Absolutely loved it, would buy again.",
    "Broke after two days. Waste of money.",
    "It arrived on Tuesday.",
    "Best purchase of the year!",
    "The colour is fine, I guess.",
    "Terrible customer service, never again.",
    "Does what it says.",
    "I am so happy with this blender.",
    "Screen cracked in the box.",
    "Meh.",
    "Five stars, my kids adore it.",
    "Returned it the same day.",
    "Average battery life.",
    "Superb build quality and fast shipping.",
    "It smells weird and the lid does not close.",
    "Okay for the price.",
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def sentiment_prompt(review: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "Classify the sentiment of the review as positive, negative or neutral."},
        {"role": "user", "content": review},
    ]


@pytest.fixture(scope="module")
def generator():
    from batch_assets.resources.hf.generator import TransformersGenerator

    return TransformersGenerator(device="cpu", batch_size=16).load_for_tests()


def test_every_row_is_one_of_the_labels(generator):
    conversations = [sentiment_prompt(r) for r in REVIEWS]
    results = generator.generate(conversations, GenerationParams(max_new_tokens=6, choices=LABELS))
    assert len(results) == len(REVIEWS)
    for r in results:
        assert r.error is None, r
        assert r.text in LABELS
        assert r.parsed == r.text
        assert validate_output(r.text, StructuredOutput(choices=list(LABELS))) == (r.text, None)
    # Rows come back in the caller's order even though batches are sorted by prompt length.
    expected_lengths = [len(ids) for ids in generator.encode_prompts(conversations)]
    assert [r.prompt_tokens for r in results] == expected_lengths


def test_json_schema_output_parses_and_validates(generator):
    conversations = [
        [{"role": "user", "content": f"Invent a person called {name} and give their name and age as JSON."}]
        for name in ("Ada", "Bjorn", "Chen")
    ]
    results = generator.generate(conversations, GenerationParams(max_new_tokens=40, json_schema=PERSON))
    structured = StructuredOutput(json_schema=PERSON)
    for r in results:
        assert r.error is None, r
        value, problem = validate_output(r.text, structured)
        assert problem is None
        assert r.parsed == value == json.loads(r.text)
        assert set(value) == {"name", "age"} and isinstance(value["age"], int)
        assert len(value["name"]) <= 16
    import pyarrow as pa

    assert pa.array([r.parsed for r in results], arrow_type_for(structured)).null_count == 0


def test_budget_too_small_for_the_schema_gives_row_errors_with_raw_text(generator):
    conversations = [[{"role": "user", "content": "Give a name and an age as JSON."}]] * 2
    results = generator.generate(conversations, GenerationParams(max_new_tokens=4, json_schema=PERSON))
    assert len(results) == 2
    for r in results:
        assert r.parsed is None
        assert r.error is not None and "max_new_tokens=4" in r.error
        assert r.text and r.text.startswith("{")  # the raw, cut-off output is kept
        assert r.completion_tokens == 4


def test_regex_output_matches(generator):
    conversations = [[{"role": "user", "content": "Write a phone number in the form 555-1234."}]] * 2
    results = generator.generate(conversations, GenerationParams(max_new_tokens=12, regex=r"[0-9]{3}-[0-9]{4}"))
    for r in results:
        assert r.error is None, r
        assert r.parsed == r.text and len(r.text) == 8 and r.text[3] == "-"


def test_constraint_xgrammar_cannot_compile_fails_the_call_with_the_reason(generator):
    with pytest.raises(ValueError, match="regex constraint cannot be compiled.*[Ll]ookbehind"):
        generator.generate([sentiment_prompt("fine")], GenerationParams(max_new_tokens=4, regex=r"(?<=a)b"))
