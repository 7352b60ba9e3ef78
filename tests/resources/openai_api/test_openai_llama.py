"""The OpenAI-compatible provider against a real llama.cpp server running SmolLM2-135M on loopback.

The model is tiny: these tests check the plumbing and the constraints (labels, JSON), never the answers' accuracy.
llama.cpp's server runs one request at a time, so prompts are few and completions short.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg
import pytest

from batch_assets.resources.base import LOAD_COUNTS
from batch_assets.resources.openai_api import EmbeddingError, OpenAICompatibleProvider
from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import StructuredOutput, validate_output
from tests.resources.openai_api.llama_server import LlamaServer

LABELS = ("Law Firm", "Healthcare", "Technology", "Retail", "Finance", "Other")
COMPANIES = ["Acme Bank", "Mayo Clinic", "Microsoft", "Walmart", "Baker McKenzie", "Joe's Pizza"]
SYSTEM = "You infer company industries. Choose from: " + ", ".join(LABELS) + "."


def conversation(company: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What industry is this company in: {company}?"},
    ]


@pytest.fixture(scope="module")
def llama(llama_server: LlamaServer) -> Iterator[OpenAICompatibleProvider]:
    provider = OpenAICompatibleProvider(
        model="smollm2",
        base_url=llama_server.base_url,
        json_schema_mode="json_object_schema",  # llama.cpp refuses OpenAI's json_schema form
        max_concurrency=2,
        timeout_s=30,
    ).load_for_tests()
    yield provider
    provider.close()


def test_chat_generation_one_result_per_row_with_usage(llama):
    rows = [conversation(c) for c in COMPANIES[:4]]
    results = llama.generate(rows, GenerationParams(max_new_tokens=8))
    assert len(results) == len(rows)
    for r in results:
        assert r.error is None
        assert r.text and r.text.strip()
        assert r.prompt_tokens and r.prompt_tokens > 10  # the system prompt alone is longer than that
        assert r.completion_tokens and 0 < r.completion_tokens <= 8
    stats = llama.last_call_stats
    assert (stats.rows, stats.failed_rows) == (4, 0)
    assert stats.completion_tokens == sum(r.completion_tokens for r in results)


def test_choices_every_answer_is_one_of_the_labels(llama):
    results = llama.generate([conversation(c) for c in COMPANIES], GenerationParams(max_new_tokens=4, choices=LABELS))
    assert [r.error for r in results] == [None] * len(COMPANIES)
    assert all(r.text in LABELS for r in results), [r.text for r in results]
    assert all(r.completion_tokens for r in results)


def test_json_schema_output_is_json_that_fits_the_schema(llama):
    schema = {
        "type": "object",
        "properties": {"industry": {"type": "string", "enum": list(LABELS)}, "is_public": {"type": "boolean"}},
        "required": ["industry", "is_public"],
        "additionalProperties": False,
    }
    rows = [conversation(c) for c in COMPANIES[:2]]
    results = llama.generate(rows, GenerationParams(max_new_tokens=40, json_schema=schema))
    for r in results:
        assert r.error is None
        value = json.loads(r.text)
        assert value["industry"] in LABELS and isinstance(value["is_public"], bool)


# Asks for JSON and then an explanation: unconstrained, SmolLM2 answers in prose (or JSON and prose).
TALKATIVE = ('Reply with a JSON object {"industry": one of ' + ", ".join(LABELS) + ', "is_public": true or false}, '
             "then explain your answer.")
INDUSTRY_SCHEMA = {
    "type": "object",
    "properties": {"industry": {"type": "string", "enum": list(LABELS)}, "is_public": {"type": "boolean"}},
    "required": ["industry", "is_public"],
    "additionalProperties": False,
}


def test_json_schema_is_enforced_on_llama_cpp_with_the_default_settings(llama_server):
    # No json_schema_mode in the config: the provider asks the server's /models, sees llama.cpp and sends the
    # schema in the one form llama.cpp enforces. The same rows unconstrained do not parse (they talk past the JSON).
    structured = StructuredOutput(json_schema=INDUSTRY_SCHEMA)
    rows = [[{"role": "system", "content": TALKATIVE}, {"role": "user", "content": f"Company: {c}"}]
            for c in COMPANIES[1:4]]
    provider = OpenAICompatibleProvider(model="smollm2", base_url=llama_server.base_url, timeout_s=60).load_for_tests()
    try:
        free = provider.generate(rows, GenerationParams(max_new_tokens=24))
        constrained = provider.generate(rows, GenerationParams(max_new_tokens=40, json_schema=INDUSTRY_SCHEMA))
        mode = provider.describe()["json_schema_mode"]
    finally:
        provider.close()
    assert all(validate_output(r.text, structured)[1] is not None for r in free), [r.text for r in free]
    assert mode == "json_object_schema"
    assert [r.error for r in constrained] == [None] * len(rows)
    assert [validate_output(r.text, structured)[1] for r in constrained] == [None] * len(rows), [
        r.text for r in constrained]


def test_the_hint_for_unparseable_json_follows_the_servers_finish_reason(llama):
    structured = StructuredOutput(json_schema=INDUSTRY_SCHEMA)
    row = [{"role": "system", "content": TALKATIVE}, {"role": "user", "content": "Company: Microsoft"}]
    cut, ended = llama.generate([row, row], GenerationParams(max_new_tokens=3))[0], None
    for budget in (48, 96):  # unconstrained prose that the model ends itself
        ended = llama.generate([row], GenerationParams(max_new_tokens=budget))[0]
        if ended.finish_reason == "stop":
            break
    assert cut.finish_reason == "length" and ended.finish_reason == "stop", (cut, ended)
    assert "raise max_new_tokens" in validate_output(cut.text, structured, cut.finish_reason)[1]
    problem = validate_output(ended.text, structured, ended.finish_reason)[1]
    assert "did not enforce the output format" in problem
    assert "max_new_tokens" not in problem and "cut off" not in problem


def test_openai_json_schema_form_on_llama_cpp_ends_in_row_errors_not_a_crash(llama_server):
    provider = OpenAICompatibleProvider(
        model="smollm2", base_url=llama_server.base_url, max_attempts=2, backoff_base_s=0.01,
        json_schema_mode="json_schema",  # asked for explicitly: the form llama-cpp-python refuses
    ).load_for_tests()
    try:
        results = provider.generate([conversation("Walmart")], GenerationParams(choices=LABELS))
    finally:
        provider.close()
    assert results[0].text is None
    assert "HTTP 500" in results[0].error and "gave up after 2 attempts" in results[0].error


def test_per_token_embeddings_are_refused_with_the_reason(llama):
    # llama.cpp's server returns one vector per token for this model (no pooling layer): not usable as an embedding.
    with pytest.raises(EmbeddingError, match="one vector per token"):
        llama.embed(["a short text", "another one"])


def test_as_a_dagster_resource_with_the_key_from_the_environment(llama_server, monkeypatch):
    monkeypatch.setenv("LLAMA_TEST_KEY", "local-key-not-checked")
    before = LOAD_COUNTS["OpenAICompatibleProvider"]

    @dg.asset
    def industries(llm: OpenAICompatibleProvider) -> dg.MaterializeResult:
        results = llm.generate([conversation(c) for c in COMPANIES[:2]], GenerationParams(choices=LABELS))
        assert all(r.text in LABELS for r in results)
        return dg.MaterializeResult(metadata={**llm.describe(), "rows": len(results)})

    provider = OpenAICompatibleProvider(
        model="smollm2",
        base_url=llama_server.base_url,
        api_key=dg.EnvVar("LLAMA_TEST_KEY"),
        json_schema_mode="json_object_schema",
    )
    result = dg.materialize([industries], resources={"llm": provider})
    assert result.success
    metadata = result.asset_materializations_for_node("industries")[0].metadata
    assert metadata["rows"].value == 2 and metadata["provider"].value == "OpenAICompatibleProvider"
    assert LOAD_COUNTS["OpenAICompatibleProvider"] == before + 1
