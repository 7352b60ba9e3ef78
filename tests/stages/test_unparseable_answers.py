"""Answers that do not parse as the structured output (issue 14, finding 6), through the real pipeline and the real
OpenAI-compatible provider, against a scripted endpoint on loopback (tests/resources/openai_api/fault_proxy.py) that answers
like the user's LLM did: the plain word "Technology" where a JSON object was asked for.

- by default the first 5 answers of a partition that all fail the same way stop the step before the rest is sent,
  and the failure shows the raw answers and the fix for an endpoint that ignores the format;
- `on_unparseable: row_error` keeps them as row errors (dead letters) within max_error_fraction, with their count and
  raw answers in the metadata, and the provider's log line counts them (never "0 failed" for them);
- `on_unparseable: fail` fails at the first chunk holding one, showing the raw answers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_spec, read_output, run_pipeline, write_csv
from tests.resources.openai_api.fault_proxy import FaultProxy, Reply

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKETS_API_KEY", "sk-local-test")

SCHEMA = {"type": "object", "properties": {"industry": {"type": "string"}}, "required": ["industry"]}
TICKETS: dict = {
    "name": "tickets",
    "source": {"format": "csv", "path": "PLACEHOLDER/{partition}.csv", "columns": ["ticket_id", "company"]},
    "partitioning": {"kind": "static", "keys": ["day1"]},
    "prepare": {"id_column": "ticket_id", "template": "Industry of {company}? Answer as JSON."},
    "task": {"kind": "generate", "params": {"max_new_tokens": 16},
             "structured": {"json_schema": SCHEMA}, "structured_column": "parsed"},
    "model": {"provider": "openai", "config": {"model": "scripted", "base_url": "PROXY", "api_key": {"env": "TICKETS_API_KEY"},
                                              "max_concurrency": 4, "max_attempts": 1}},
}


def completion(text: str):
    def make(body: dict) -> dict:
        return {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
    return make


def plain_word_for(companies_answering_json: set[str]):
    """The endpoint ignores the format: "Technology" for every row, except valid JSON for the named companies."""
    def script(key: str, n: int):
        company = key.removeprefix("Industry of ").split("?")[0]
        if company in companies_answering_json:
            return Reply(completion(json.dumps({"industry": "Retail"})))
        return Reply(completion("Technology"))
    return script


def _spec(tmp_path: Path, proxy: FaultProxy, rows: int, structured: dict | None = None, **runtime):
    write_csv(tmp_path / "data" / "day1.csv", ["ticket_id", "company"],
              [[f"T{i}", f"company{i}"] for i in range(rows)])
    task = {**TICKETS["task"], "structured": {"json_schema": SCHEMA, **(structured or {})}}
    model = {**TICKETS["model"], "config": {**TICKETS["model"]["config"], "base_url": proxy.url}}
    return make_spec(TICKETS, tmp_path / "data", task=task, model=model, runtime=runtime)


def step_failure(result) -> str:
    return next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").event_specific_data.error.message


def test_identical_unparseable_answers_stop_the_step_after_a_few_requests(tmp_path: Path) -> None:
    with FaultProxy(plain_word_for(set())) as proxy:
        spec = _spec(tmp_path, proxy, rows=40)
        result = run_pipeline(spec, tmp_path / "store", ["day1"], raise_on_error=False)

    assert not result.success
    assert len(proxy.attempts) == 5  # not the whole chunk of 40 (512 by default) paid requests
    message = step_failure(result)
    assert "the first 5 answers" in message and "'Technology'" in message and "row 'T0'" in message
    assert "is not valid JSON" in message
    assert "constraint_backend" in message and "json_schema_mode" in message  # the fix for an endpoint ignoring it
    assert "setup or endpoint problem" not in message  # the old, wrong hint


def test_row_error_policy_keeps_unparseable_answers_as_dead_letters_with_their_raw_text(tmp_path: Path) -> None:
    answering = {f"company{i}" for i in range(0, 20, 2)}  # half the rows parse
    with FaultProxy(plain_word_for(answering)) as proxy:
        spec = _spec(tmp_path, proxy, rows=20, structured={"on_unparseable": "row_error"}, max_error_fraction=0.6)
        instance = dg.DagsterInstance.ephemeral()
        result = run_pipeline(spec, tmp_path / "store", ["day1"], instance=instance)

    assert result.success
    assert len(proxy.attempts) == 20  # the probe found answers that parse: every row sent once
    out = read_output(spec, tmp_path / "store", "day1").to_pylist()
    assert [r["ticket_id"] for r in out] == [f"T{i}" for i in range(20)]
    bad = [r for r in out if r["error"]]
    assert len(bad) == 10 and all(r["generated_text"] == "Technology" and r["parsed"] is None for r in bad)
    assert all("'Technology' is not valid JSON" in r["error"] for r in bad)
    md = next(e.event_specific_data.materialization.metadata for e in result.all_events
              if e.event_type_value == "ASSET_MATERIALIZATION" and e.asset_key == dg.AssetKey(["tickets", "inferred"]))
    assert md["unparseable_rows"].value == 10 and "'Technology'" in md["unparseable_samples"].value
    assert md["error_rate"].value == 0.5
    dead = pq.read_table(next((tmp_path / "store").rglob("*dead_letters*/*.parquet"))).to_pylist()
    assert sorted(r["row_id"] for r in dead) == sorted(r["ticket_id"] for r in bad)
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    # one line per provider call (the probe of 5 rows, then the rest): every line counts the answers that do not parse
    import re

    counts = [re.search(r"(\d+) rows, (\d+) failed requests, (\d+) answers not valid json_schema output", m)
              for m in logs if "failed requests" in m]
    assert counts and all(counts)
    assert [sum(int(c.group(i)) for c in counts) for i in (1, 2, 3)] == [20, 0, 10]


def test_fail_policy_fails_at_the_first_unparseable_answer_showing_it(tmp_path: Path) -> None:
    with FaultProxy(plain_word_for({f"company{i}" for i in range(1, 8)})) as proxy:  # only T0 does not parse
        spec = _spec(tmp_path, proxy, rows=8, structured={"on_unparseable": "fail"})
        result = run_pipeline(spec, tmp_path / "store", ["day1"], raise_on_error=False)

    assert not result.success
    message = step_failure(result)
    assert "1 of the 8 answers in chunk 0 did not parse" in message and "row 'T0': 'Technology'" in message


def test_requests_metadata_counts_what_the_endpoint_saw_not_response_cache_hits(tmp_path: Path) -> None:
    with FaultProxy(plain_word_for({f"company{i}" for i in range(6)})) as proxy:
        spec = _spec(tmp_path, proxy, rows=6, response_cache=True)
        first = run_pipeline(spec, tmp_path / "store", ["day1"])
        # A plain rerun would skip the partition (its lineage record matches: no read, no model call); forced, it
        # infers again and every answer comes from the response cache.
        from batch_assets.orchestration.assets.lineage import RERUN_TAG
        from tests.conftest import pipeline_definitions

        job = pipeline_definitions(spec, tmp_path / "store").resolve_job_def(f"{spec.name}_job")
        second = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(),
                                        tags={"dagster/partition": "day1", RERUN_TAG: "force"})

    def infer_md(result) -> dict:
        return next(e.event_specific_data.materialization.metadata for e in result.all_events
                    if e.event_type_value == "ASSET_MATERIALIZATION"
                    and e.asset_key == dg.AssetKey(["tickets", "inferred"]))

    assert first.success and second.success
    assert len(proxy.attempts) == 6  # the endpoint saw each row once
    assert (infer_md(first)["requests"].value, infer_md(first)["cache_hits"].value) == (6, 0)
    assert (infer_md(second)["requests"].value, infer_md(second)["cache_hits"].value) == (0, 6)


def test_a_pipeline_accepting_every_row_failing_is_not_stopped_early(tmp_path: Path) -> None:
    with FaultProxy(plain_word_for(set())) as proxy:
        spec = _spec(tmp_path, proxy, rows=12, max_error_fraction=1.0)
        result = run_pipeline(spec, tmp_path / "store", ["day1"])

    assert result.success and len(proxy.attempts) == 12
    out = read_output(spec, tmp_path / "store", "day1").to_pylist()
    assert len(out) == 12 and all("unparseable answer" in r["error"] for r in out)


def test_real_llama_server_ignoring_the_constraint_is_stopped_and_enforcing_it_passes(tmp_path: Path, request) -> None:
    """SmolLM2 on llama.cpp's real server. With `constraint_backend: vllm` the constraint travels in a field
    llama.cpp ignores, so the model answers prose: the step stops after 5 requests and says how to send the format
    llama.cpp enforces. With that fix (`response_format` + `json_object_schema`) the same rows all parse."""
    from tests.resources.openai_api.fault_proxy import Forward

    server = request.getfixturevalue("llama_server")
    write_csv(tmp_path / "data" / "day1.csv", ["ticket_id", "company"],
              [[f"T{i}", name] for i, name in enumerate(["Acme Software", "Mercy Hospital", "Baker LLP", "Shop Mart",
                                                          "Steel Works", "First Bank", "Oak Realty", "Nova Tech"])])

    def spec_with(**config):
        model = {**TICKETS["model"], "config": {**TICKETS["model"]["config"], "model": "smollm2",
                                                "max_concurrency": 1, **config}}
        return make_spec(TICKETS, tmp_path / "data", model=model,
                         prepare={"template": "What industry is {company} in? Answer with one word."},
                         task={**TICKETS["task"], "params": {"max_new_tokens": 48}},
                         runtime={"max_error_fraction": 0.25})  # a 135M model: an answer may still run long

    with FaultProxy(lambda key, n: Forward(), upstream=server.root) as proxy:
        ignored = spec_with(base_url=proxy.url, constraint_backend="vllm")
        result = run_pipeline(ignored, tmp_path / "store", ["day1"], raise_on_error=False)
        assert not result.success
        assert len(proxy.attempts) == 5  # of 8 rows
        message = step_failure(result)
        assert "the first 5 answers" in message and "is not valid JSON" in message and "row 'T0'" in message
        assert "json_object_schema" in message

        enforced = spec_with(base_url=proxy.url, json_schema_mode="json_object_schema")
        result = run_pipeline(enforced, tmp_path / "store2", ["day1"])
        assert len(proxy.attempts) == 5 + 8  # the probe's answers parsed: every row sent, once
    assert result.success
    out = read_output(enforced, tmp_path / "store2", "day1").to_pylist()
    assert len(out) == 8 and sum(r["error"] is None and r["parsed"]["industry"] is not None for r in out) >= 6
