"""Structured outputs against the real llama.cpp server (llama-cpp-python, SmolLM2-135M) through the real provider and
pipeline (issue 24 item 6): what the server's grammar leaves unenforced is said once at the start and caught by
validation, so a broken rule or a repeated key is a row error naming field and rule, never a published value.

What the server does (measured, bench/structured_enforcement.py): its grammar closes objects and enforces lengths,
anchored patterns, item counts and date formats, but not `minimum`/`maximum`, not a length beside a `pattern`, and
a pattern it cannot convert (a look-around) makes it drop the WHOLE schema silently: any JSON, extra keys included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from batch_assets.resources.openai_api import OpenAICompatibleProvider
from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import StructuredOutput, validate_output
from tests.conftest import make_spec, read_output, run_pipeline, write_csv
from tests.resources.openai_api.llama_server import LlamaServer

pytestmark = pytest.mark.slow  # a real generative model behind a real server, two pipeline runs

# A pattern with a look-ahead (valid JSON Schema: "holds a lower-case letter"): llama-cpp-python's server cannot
# build a grammar for it and falls back to any JSON, as the user's server did for their whole schema.
NO_GRAMMAR = {"type": "string", "pattern": "^(?=.*[a-z]).+$"}
COPY = "Copy this JSON exactly, character for character, and output nothing else:\n{}"


def _ask(provider: OpenAICompatibleProvider, prompts: list[str], structured: StructuredOutput, tokens: int = 40):
    rows = [[{"role": "user", "content": p}] for p in prompts]
    params = GenerationParams(max_new_tokens=tokens, temperature=0, **structured.generation_constraints())
    return provider.generate(rows, params)


@pytest.fixture(scope="module")
def llama(llama_server: LlamaServer):
    # json_schema_mode left at 'auto': the provider finds out it talks to llama.cpp, as a user's would
    provider = OpenAICompatibleProvider(model="smollm2", base_url=llama_server.base_url, max_concurrency=2,
                                        timeout_s=60).load_for_tests()
    yield provider
    provider.close()


def test_keys_the_schema_does_not_list_are_row_errors_by_default(llama):
    # The server drops this schema (the look-ahead), so nothing stops the model adding keys: the closed schema
    # (additionalProperties: false, the default) turns each such answer into a row error naming the key; left
    # open, the answer would pass and its extra keys vanish without a word.
    structured = StructuredOutput(json_schema={"type": "object", "properties": {"name": NO_GRAMMAR},
                                               "required": ["name"]})
    prompts = [COPY.format('{"name": "Acme", "city": "Oslo"}'), COPY.format('{"name": "Ann", "age": 25}'),
               COPY.format('{"name": "Walmart"}')]
    results = _ask(llama, prompts, structured)
    extra = []
    for result in results:
        assert result.error is None, result.error
        try:
            keys = set(json.loads(result.text))
        except ValueError:
            continue
        if keys - {"name"}:
            extra.append((result.text, *validate_output(result.text, structured, result.finish_reason)))
    assert extra, f"the model added no key this time: {[r.text for r in results]}"
    for text, value, problem in extra:
        assert value is None, f"an answer with extra keys passed: {text}"
        assert "Additional properties are not allowed" in problem and "additionalProperties" in problem, problem


def _pipeline(tmp_path: Path, server: LlamaServer, schema: dict[str, Any], template: str, companies: list[str],
              **config: Any):
    write_csv(tmp_path / "data" / "day1.csv", ["ticket_id", "company"],
              [[f"T{i}", c] for i, c in enumerate(companies)])
    raw = {
        "name": "llama_structured",
        "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["ticket_id", "company"]},
        "partitioning": {"kind": "static", "keys": ["day1"]},
        "prepare": {"id_column": "ticket_id", "template": template},
        "task": {"kind": "generate", "params": {"max_new_tokens": 24, "temperature": 0},
                 "structured": {"json_schema": schema, "stop_after_unparseable": 0}, "structured_column": "parsed"},
        "model": {"provider": "openai", "config": {"model": "smollm2", "base_url": server.base_url,
                                                  "max_concurrency": 2, "max_attempts": 1, **config}},
        "runtime": {"max_error_fraction": 1.0},  # publish the partition: its rows say what went wrong
    }
    spec = make_spec(raw, tmp_path / "data")
    instance = dg.DagsterInstance.ephemeral()
    result = run_pipeline(spec, tmp_path / "store", ["day1"], instance=instance)
    messages = [e.user_message or "" for e in instance.all_logs(result.run_id)]
    return read_output(spec, tmp_path / "store", "day1").to_pylist(), messages


def test_a_length_the_grammar_ignores_is_said_at_the_start_and_each_breach_is_a_row_error(tmp_path, llama_server):
    # llama.cpp's grammar enforces the pattern and ignores maxLength beside it (measured): upper-case names longer
    # than 3 letters come back, and must not be published as tickers.
    schema = {"type": "object", "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3}},
              "required": ["ticker"]}
    rows, messages = _pipeline(tmp_path, llama_server, schema,
                               "Write the name {company} in capital letters, without spaces, as the ticker.",
                               ["Microsoft", "Walmart", "Baker McKenzie", "Acme Bank", "Mayo Clinic", "IBM"])
    warnings = [m for m in messages if "the decoder does not enforce" in m]
    assert len(warnings) == 1, warnings  # said once, before the first request
    assert "llama.cpp server grammar" in warnings[0]
    assert "maxLength/minLength with pattern or format (at $.ticker)" in warnings[0]
    answered = [json.loads(r["generated_text"])["ticker"] for r in rows]  # the grammar keeps them JSON
    assert any(len(t) > 3 for t in answered), f"every ticker was short this time: {answered}"
    for row, ticker in zip(rows, answered):
        if len(ticker) <= 3:
            assert row["error"] is None and row["parsed"] == {"ticker": ticker}, row
        else:
            assert row["parsed"] is None, row  # never published
            assert row["error"] and f"at $.ticker: '{ticker}' is too long (schema rule maxLength: 3)" in row["error"], row


def test_a_repeated_key_in_a_real_answer_is_a_row_error_not_last_wins(tmp_path, llama_server):
    # An endpoint that does not enforce the schema (llama.cpp ignores vLLM's structured_outputs field) and whose
    # answers repeat a key: here forced by a llama.cpp grammar passed through extra_body, as a runaway model does.
    grammar = r'root ::= "{\"name\": \"" [A-Z] [a-z]+ "\", \"name\": \"" [A-Z] [a-z]+ "\"}"'
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    rows, _ = _pipeline(tmp_path, llama_server, schema, "Name two people who work at {company}.",
                        ["Walmart", "IBM"], constraint_backend="vllm", extra_body={"grammar": grammar})
    assert len(rows) == 2
    for row in rows:
        assert row["parsed"] is None, row
        assert "appears twice in one object" in row["error"] and "the key 'name'" in row["error"], row
