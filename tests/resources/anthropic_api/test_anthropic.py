"""The `anthropic` provider against the loopback stand-in of Anthropic's Messages API and Message Batches
(anthropic_standin.py): a whole pipeline run online (structured choices, 529 overloaded and 429 with retry-after
retried, a refusal as a row error, cost from the spec's prices, the key nowhere in metadata or logs) and through
Message Batches (every row exactly once from out-of-order results, errored / canceled / expired results, batch
prices, a lost create answer re-attached or refused when it cannot be told apart)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import dagster as dg
import pytest

from batch_assets.spec import parse_spec
from tests.resources.conftest import API_KEY, StandinProcess, anthropic_client, inferred_metadata, rows, step_error
from tests.conftest import read_output, run_pipeline, write_jsonl

COLOURS = ["red", "green", "blue"]
FAST = 100_000  # stand-in seconds per real second: a batch's minutes (and a 24 h window) pass in moments
PRICE_IN, PRICE_OUT = 3.0, 15.0  # USD per million tokens, online


def make_spec(data: Path, standin: StandinProcess, name: str = "claude", **config) -> dict:
    return {
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Which colour is it? {text}",
                    "system": "Answer with one colour."},
        "task": {"kind": "generate", "params": {"max_new_tokens": 8},
                 "structured": {"choices": COLOURS}, "structured_column": "colour"},
        "model": {"provider": "anthropic",
                  "config": {"model": "claude-standin", "base_url": standin.root,
                             "api_key": {"env": "STANDIN_KEY"}, "backoff_base_s": 0.1, **config},
                  "pricing": {"input_per_million_tokens": PRICE_IN, "output_per_million_tokens": PRICE_OUT}},
        "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5},
    }


def expected_colour(text: str) -> str:
    return next(c for c in COLOURS if c in text)


# -- online ----------------------------------------------------------------------------------------------------------
def test_online_rows_are_answered_with_overload_and_rate_limits_retried(tmp_path: Path, anthropic_standin,
                                                                        caplog, capfd):
    texts = {f"d{i}": f"a {COLOURS[i % 3]} thing number {i}" for i in range(8)}
    texts["d2"] = "busy [[529-once]] blue"
    texts["d4"] = "limited [[429-once]] green"
    texts["d6"] = "refused [[400]] red"
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    spec = parse_spec(make_spec(tmp_path / "data", anthropic_standin))
    instance = dg.DagsterInstance.ephemeral()
    with caplog.at_level(logging.DEBUG):
        assert run_pipeline(spec, tmp_path / "store", ["a"], instance=instance).success

    by_id = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert sorted(by_id) == sorted(texts)  # every row exactly once
    for doc_id, text in texts.items():
        if doc_id == "d6":  # Anthropic's 400 is the row's, said with its error type
            assert by_id[doc_id]["colour"] is None
            assert "HTTP 400 invalid_request_error" in by_id[doc_id]["error"], by_id[doc_id]
        else:
            assert (by_id[doc_id]["colour"], by_id[doc_id]["error"]) == (expected_colour(text), None), by_id[doc_id]

    log = anthropic_standin.stats()["message_log"]
    tries = {marker: [e for e in log if marker in e["prompt"]] for marker in ("[[529-once]]", "[[429-once]]")}
    assert [e["status"] for e in tries["[[529-once]]"]] == [529, 200], log  # overloaded: transient, asked again
    limited = tries["[[429-once]]"]
    assert [e["status"] for e in limited] == [429, 200], log
    assert limited[1]["at"] - limited[0]["at"] >= 2.0, limited  # the retry waited for the server's retry-after: 2
    assert all(e["status"] != 400 or "[[400]]" in e["prompt"] for e in log), log  # nothing else refused
    assert sum(1 for e in log if "[[400]]" in e["prompt"]) == 1, log  # a refusal is not retried

    md = inferred_metadata(instance, "claude")
    assert md["tokens_in"] > 0
    assert md["cost_usd"] == pytest.approx((md["tokens_in"] * PRICE_IN + md["tokens_out"] * PRICE_OUT) / 1e6,
                                           abs=1e-6)
    everything = str(md) + caplog.text + "".join(capfd.readouterr())
    assert API_KEY not in everything, "the API key appeared in metadata, a log line or the output"


def test_a_rejected_key_fails_the_step_at_once_naming_the_fix(tmp_path: Path, anthropic_standin, monkeypatch):
    monkeypatch.setenv("STANDIN_KEY", "sk-ant-wrong-key-000")
    write_jsonl(tmp_path / "data" / "a.jsonl", rows({f"d{i}": f"red {i}" for i in range(6)}))
    raw = make_spec(tmp_path / "data", anthropic_standin)
    raw["retries"] = {"max_retries": 0}
    result = run_pipeline(parse_spec(raw), tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    message = step_error(result)
    assert "rejected the key" in message and "ANTHROPIC_API_KEY" in message, message
    assert "sk-ant-wrong-key-000" not in message
    assert anthropic_standin.stats()["messages"] == 0  # refused at the door: no row was answered


# -- Message Batches -------------------------------------------------------------------------------------------------
def test_every_row_once_through_message_batches_at_the_batch_price(tmp_path: Path, anthropic_standin):
    from batch_assets.reliability.batches import ledger_url
    from batch_assets.reliability.checkpoint import staging_url
    from batch_assets.storage import ArrowStorage, filesystem_for

    texts = {f"d{i}": f"a {COLOURS[i % 3]} thing number {i}" for i in range(10)}
    texts["d3"] = "refused [[400]] red"
    texts["d5"] = "busy [[529-once]] green"
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    spec = parse_spec(make_spec(tmp_path / "data", anthropic_standin, batch_api=True, batch_poll_interval_s=0.2))
    anthropic_standin.advance(speed=FAST)
    instance = dg.DagsterInstance.ephemeral()
    assert run_pipeline(spec, tmp_path / "store", ["a"], instance=instance).success

    by_id = {r["doc_id"]: r for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert sorted(by_id) == sorted(texts)  # every row exactly once, matched by custom_id from shuffled results
    for doc_id, text in texts.items():
        if doc_id == "d3":  # an errored result of type invalid_request_error: the row's error, not retried
            assert by_id[doc_id]["colour"] is None and "invalid_request_error" in by_id[doc_id]["error"]
        else:
            assert (by_id[doc_id]["colour"], by_id[doc_id]["error"]) == (expected_colour(text), None), by_id[doc_id]
    stats = anthropic_standin.stats()
    # overloaded_error is transient: the row went into a second batch; nothing was sent online
    assert stats["batches_created"] == 2 and stats["statuses"] == {"ended": 2}
    assert sorted(b["request_counts"]["processing"] + b["request_counts"]["succeeded"] + b["request_counts"]["errored"]
                  for b in stats["batches"]) == [1, 10]
    assert stats["messages"] == 0
    md = inferred_metadata(instance, "claude")
    assert (md["batches_submitted"], md["batch_rows"], md["requests"]) == (2, 9, 0)
    online_cost = (md["tokens_in"] * PRICE_IN + md["tokens_out"] * PRICE_OUT) / 1e6
    assert md["tokens_in"] > 0 and md["cost_usd"] == pytest.approx(online_cost / 2, abs=1e-6)
    ledger = ledger_url(staging_url(ArrowStorage(root=str(tmp_path / "store")), "claude", "a"))
    assert not filesystem_for(ledger)[0].exists(filesystem_for(ledger)[1])


@pytest.mark.parametrize("retry_rows", ["online", "new_batch"])
def test_expired_requests_go_online_or_into_a_new_batch_then_are_owed(tmp_path: Path, anthropic_standin,
                                                                      retry_rows: str):
    """A request the batch never ran (expired at 24 h; the others' results kept): sent online when the setting
    says so, else into a new batch, at most max_attempts times, then owed: the partition is not published."""
    texts = {"d0": "red one", "d1": "stuck [[slow]] blue", "d2": "green two"}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", anthropic_standin, batch_api=True, batch_poll_interval_s=0.2, max_attempts=2,
                    batch_retry_rows=retry_rows)
    raw["retries"] = {"max_retries": 0}
    spec = parse_spec(raw)
    anthropic_standin.advance(speed=FAST)
    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    stats = anthropic_standin.stats()
    expired = [b["request_counts"] for b in stats["batches"]]
    if retry_rows == "online":
        assert result.success
        out = {r["doc_id"]: r["colour"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
        assert out == {"d0": "red", "d1": "blue", "d2": "green"}
        assert [(c["succeeded"], c["expired"]) for c in expired] == [(2, 1)] and stats["messages"] == 1
    else:
        assert not result.success
        message = step_error(result)
        assert "1 row(s) got no answer" in message and "expired" in message, message
        assert [(c["succeeded"], c["expired"]) for c in expired] == [(2, 1), (0, 1)] and stats["messages"] == 0
        with pytest.raises(FileNotFoundError):
            read_output(spec, tmp_path / "store", "a")


def test_a_lost_create_answer_is_found_again_and_never_submitted_twice(tmp_path: Path, anthropic_standin):
    texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(5)}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", anthropic_standin, batch_api=True, batch_poll_interval_s=0.2)
    raw["retries"] = {"max_retries": 0}
    spec = parse_spec(raw)
    anthropic_standin.faults(lose_create_response=1)  # the batch is made, its answer is a 500
    anthropic_standin.advance(speed=FAST)
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    stats = anthropic_standin.stats()
    assert stats["batches_created"] == 1 and stats["calls"].get("GET /v1/messages/batches", 0) >= 1
    assert sorted(r["doc_id"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()) == sorted(texts)


def test_a_lost_create_answer_that_cannot_be_told_apart_stops_the_partition(tmp_path: Path, anthropic_standin):
    """Anthropic batches carry no token: with another batch of the same size created meanwhile, the lost one cannot
    be identified, and the partition stops naming both and the ledger file rather than guess or submit again."""
    texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(5)}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", anthropic_standin, batch_api=True, batch_poll_interval_s=0.2)
    raw["retries"] = {"max_retries": 0}
    spec = parse_spec(raw)
    other = anthropic_client(anthropic_standin).messages.batches.create(requests=[
        {"custom_id": f"other-{i}", "params": {"model": "claude-standin", "max_tokens": 8,
                                               "messages": [{"role": "user", "content": f"other {i}"}]}}
        for i in range(5)])
    anthropic_standin.faults(lose_create_response=1)
    anthropic_standin.advance(speed=FAST)  # a wrong guess would run to its end (and be seen), not wait forever
    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    message = step_error(result)
    stats = anthropic_standin.stats()
    [ours] = [b["id"] for b in stats["batches"] if b["id"] != other.id]
    assert "partition 'a'" in message and other.id in message and ours in message, message
    assert "submission-" in message and "batch_id" in message  # which ledger file, and what to write into it
    assert stats["batches_created"] == 2  # the other one and ours: nothing was submitted again


def test_images_and_the_system_prompt_go_in_anthropic_s_form(anthropic_standin):
    """An OpenAI-form image part (what prepare.image_columns builds) is sent as an Anthropic base64 image block, the
    system message as the top-level system; the stand-in refuses the OpenAI form, as Anthropic does."""
    import io

    from PIL import Image

    from batch_assets.resources.anthropic_api.provider import AnthropicProvider
    from batch_assets.resources.multimodal import image_content_part
    from batch_assets.resources.protocols import GenerationParams

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buf, "PNG")
    image = image_content_part(buf.getvalue())
    row = [{"role": "system", "content": "Answer with one colour."},
           {"role": "user", "content": [{"type": "text", "text": "Which colour? red"}, image]}]
    provider = AnthropicProvider(model="claude-standin", base_url=anthropic_standin.root, api_key=API_KEY,
                                 max_attempts=1).load_for_tests()
    try:
        [answer] = provider.generate([row], GenerationParams(max_new_tokens=8, choices=tuple(COLOURS)))
        assert (answer.text, answer.error) == ("red", None), answer
        # the same row sent as it is (OpenAI's image_url part): refused, so the test above would see a mapping fault
        client = anthropic_client(anthropic_standin)
        with pytest.raises(Exception, match="does not match any of the expected tags"):
            client.messages.create(model="claude-standin", max_tokens=8, messages=[row[1]])
    finally:
        provider.close()
