"""The batch path of the OpenAI-compatible provider, chosen by `batch_api: true`, through a whole pipeline run against
the Batch API stand-in: structured output, split to the limits, every row exactly once (answers matched by custom_id
from an out-of-order output file; refusals as row errors; transient failures into a new batch or online; owed rows
never published), never submitted twice (a lost create answer, a stand-in restart), cost at batch prices."""

from __future__ import annotations

import threading
from pathlib import Path

import dagster as dg
import pytest

from batch_assets.reliability.batches import ledger_url
from batch_assets.reliability.checkpoint import staging_url
from batch_assets.spec import parse_spec
from batch_assets.storage import ArrowStorage, filesystem_for
from tests.resources.conftest import StandinProcess, inferred_metadata, rows
from tests.conftest import read_output, run_pipeline, write_jsonl

COLOURS = ["red", "green", "blue"]
FAST = 100_000  # stand-in seconds per real second: a batch's minutes (and a 24 h window) pass in moments
PRICE_IN, PRICE_OUT = 2.0, 8.0  # USD per million tokens, online


def make_spec(data: Path, standin: StandinProcess, name: str = "batched", **config) -> dict:
    return {
        "name": name,
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "template": "Which colour is it? {text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 8},
                 "structured": {"choices": COLOURS}, "structured_column": "colour"},
        "model": {"provider": "openai",
                  "config": {"model": "gpt-standin", "base_url": standin.url, "api_key": {"env": "STANDIN_KEY"},
                             "batch_api": True, "batch_poll_interval_s": 0.2, "backoff_base_s": 0.1, **config},
                  "pricing": {"input_per_million_tokens": PRICE_IN, "output_per_million_tokens": PRICE_OUT}},
        "runtime": {"chunk_rows": 4, "max_error_fraction": 0.5},
    }


def test_every_row_once_through_batches_at_the_batch_price(tmp_path: Path, standin: StandinProcess):
    texts = {f"d{i}": f"a {COLOURS[i % 3]} thing number {i}" for i in range(10)}
    texts["d3"] = "refused [[400]] red"
    texts["d5"] = "flaky [[500-once]] green"
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    spec = parse_spec(make_spec(tmp_path / "data", standin))
    standin.advance(speed=FAST)
    instance = dg.DagsterInstance.ephemeral()
    assert run_pipeline(spec, tmp_path / "store", ["a"], instance=instance).success

    out = read_output(spec, tmp_path / "store", "a").to_pylist()
    assert sorted(r["doc_id"] for r in out) == sorted(texts)  # every row exactly once
    by_id = {r["doc_id"]: r for r in out}
    for doc_id, text in texts.items():
        if doc_id == "d3":
            assert by_id[doc_id]["colour"] is None and "HTTP 400" in by_id[doc_id]["error"]
        else:
            expected = next(c for c in COLOURS if c in text)
            assert (by_id[doc_id]["colour"], by_id[doc_id]["error"]) == (expected, None), by_id[doc_id]
    stats = standin.stats()
    # the 500 went into a second batch; nothing was sent online
    assert (stats["batches_created"], stats["files_uploaded"]) == (2, 2)
    assert stats["calls"].get("POST /v1/chat/completions", 0) == 0
    md = inferred_metadata(instance, "batched")
    assert (md["batches_submitted"], md["batch_rows"], md["requests"]) == (2, 9, 0)
    online_cost = (md["tokens_in"] * PRICE_IN + md["tokens_out"] * PRICE_OUT) / 1e6
    assert md["tokens_in"] > 0 and md["cost_usd"] == pytest.approx(online_cost / 2, abs=1e-6)
    # the partition's batch ledger is gone once its rows are committed
    ledger = ledger_url(staging_url(ArrowStorage(root=str(tmp_path / "store")), "batched", "a"))
    assert not filesystem_for(ledger)[0].exists(filesystem_for(ledger)[1])


def test_rows_are_split_to_the_limits_of_an_input_file(tmp_path: Path):
    standin = StandinProcess(tmp_path / "state", tmp_path / "standin.log", "--max-requests", "3").start()
    try:
        texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(8)}
        write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
        spec = parse_spec(make_spec(tmp_path / "data", standin, batch_max_requests=3))
        standin.advance(speed=FAST)
        assert run_pipeline(spec, tmp_path / "store", ["a"]).success
        stats = standin.stats()
        assert stats["batches_created"] == 3 and stats["statuses"] == {"completed": 3}
        assert sorted(b["request_counts"]["total"] for b in stats["batches"]) == [2, 3, 3]
        assert sorted(r["doc_id"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()) == sorted(texts)
    finally:
        standin.stop()


def test_expired_rows_go_online_when_the_setting_says_so(tmp_path: Path, standin: StandinProcess):
    texts = {"d0": "red one", "d1": "stuck [[slow]] blue", "d2": "green two"}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    spec = parse_spec(make_spec(tmp_path / "data", standin, batch_retry_rows="online"))
    standin.advance(speed=FAST)
    instance = dg.DagsterInstance.ephemeral()
    assert run_pipeline(spec, tmp_path / "store", ["a"], instance=instance).success
    out = {r["doc_id"]: r["colour"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()}
    assert out == {"d0": "red", "d1": "blue", "d2": "green"}
    stats = standin.stats()
    assert stats["statuses"] == {"expired": 1} and stats["batches_created"] == 1
    assert stats["calls"]["POST /v1/chat/completions"] == 1  # only the expired row, at the online price
    md = inferred_metadata(instance, "batched")
    assert (md["batch_rows"], md["batch_rows_online"], md["requests"]) == (2, 1, 1)


def test_rows_a_batch_never_answers_are_owed_and_the_partition_is_not_published(tmp_path: Path,
                                                                              standin: StandinProcess):
    texts = {"d0": "red one", "d1": "stuck [[slow]] blue"}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", standin, max_attempts=2)
    raw["retries"] = {"max_retries": 0}  # a step retry would ask once more (a rerun gives owed rows new attempts)
    spec = parse_spec(raw)
    standin.advance(speed=FAST)
    result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    error = failure.step_failure_data.error
    message = error.cause.message if error.cause else error.message
    assert "1 row(s) got no answer" in message and "batch_expired" in message, message
    stats = standin.stats()
    assert stats["batches_created"] == 2 and stats["statuses"] == {"expired": 2}  # the first, and one more try
    assert stats["calls"].get("POST /v1/chat/completions", 0) == 0
    with pytest.raises(FileNotFoundError):
        read_output(spec, tmp_path / "store", "a")


def test_a_lost_create_answer_does_not_submit_twice(tmp_path: Path, standin: StandinProcess):
    texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(5)}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", standin)
    raw["retries"] = {"max_retries": 0}  # within the step: a step retry would re-attach by the ledger anyway
    spec = parse_spec(raw)
    standin.faults(lose_create_response=1)  # the batch is made, its answer is a 500
    standin.advance(speed=FAST)
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    assert standin.stats()["batches_created"] == 1
    assert sorted(r["doc_id"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()) == sorted(texts)


def test_a_standin_restart_while_the_batch_runs_is_ridden_out(tmp_path: Path, standin: StandinProcess):
    texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(6)}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    raw = make_spec(tmp_path / "data", standin)
    raw["retries"] = {"max_retries": 0}  # ridden out within the step, not by a step retry
    spec = parse_spec(raw)
    outcome: dict = {}
    run = threading.Thread(target=lambda: outcome.update(
        result=run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)))
    run.start()
    try:
        for _ in range(600):
            if standin.stats()["batches_created"] == 1:
                break
            run.join(0.1)
        standin.advance(60 + 2)  # in progress
        standin.restart()  # SIGKILL, then the same port and state
        standin.advance(speed=FAST)
    finally:
        run.join(300)
    assert not run.is_alive() and outcome["result"].success
    stats = standin.stats()
    assert (stats["batches_created"], stats["restarts"]) == (1, 1)
    assert sorted(r["doc_id"] for r in read_output(spec, tmp_path / "store", "a").to_pylist()) == sorted(texts)


@pytest.mark.parametrize("throttled", [True, False])
def test_the_queue_of_enqueued_tokens_is_respected(tmp_path: Path, throttled: bool):
    """The stand-in refuses a batch that takes its model's queue past 60 tokens (each row here is about 23):
    with the limit set, rows go two at a time, each batch once the previous one ended; without it, the one big batch
    is refused every time and its rows are owed, the error naming the limit."""
    standin = StandinProcess(tmp_path / "state", tmp_path / "standin.log", "--enqueued-token-limit", "60").start()
    try:
        texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(6)}
        write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
        raw = make_spec(tmp_path / "data", standin, max_attempts=2,
                        **({"batch_max_enqueued_tokens": 60} if throttled else {}))
        raw["retries"] = {"max_retries": 0}
        spec = parse_spec(raw)
        standin.advance(speed=FAST)
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
        stats = standin.stats()
        if throttled:
            assert result.success
            assert stats["statuses"] == {"completed": 3}  # 2 + 2 + 2 rows, one after the other, none refused
            out = read_output(spec, tmp_path / "store", "a").to_pylist()
            assert sorted(r["doc_id"] for r in out) == sorted(texts) and all(r["error"] is None for r in out)
        else:
            assert not result.success and stats["statuses"] == {"failed": 2}
            failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
            error = failure.step_failure_data.error
            assert "token_limit_exceeded" in (error.cause.message if error.cause else error.message)
    finally:
        standin.stop()


def test_a_partition_on_s3_goes_through_batches_and_its_ledger_is_removed(tmp_path: Path, standin: StandinProcess,
                                                                          s3_bucket: str):
    texts = {f"d{i}": f"{COLOURS[i % 3]} {i}" for i in range(5)}
    write_jsonl(tmp_path / "data" / "a.jsonl", rows(texts))
    spec = parse_spec(make_spec(tmp_path / "data", standin))
    store = f"{s3_bucket}/store"
    standin.advance(speed=FAST)
    assert run_pipeline(spec, store, ["a"]).success
    assert sorted(r["doc_id"] for r in read_output(spec, store, "a").to_pylist()) == sorted(texts)
    assert standin.stats()["batches_created"] == 1
    fs, path = filesystem_for(ledger_url(staging_url(ArrowStorage(root=store), "batched", "a")))
    assert not fs.exists(path)


def test_settings_the_batch_path_cannot_serve_are_refused_before_anything_is_sent(tmp_path: Path,
                                                                                  standin: StandinProcess):
    from batch_assets.resources.provider_errors import ModelLoadError
    from batch_assets.resources.openai_api import OpenAICompatibleProvider

    with pytest.raises(ModelLoadError, match="batch_api=true needs api='chat'"):
        OpenAICompatibleProvider(model="m", base_url=standin.url, api="responses", batch_api=True).load_for_tests()
    stats = standin.stats()
    assert stats["batches_created"] == 0 and stats["files_uploaded"] == 0
    assert not any(route.startswith("POST") for route in stats["calls"])


def test_the_partitions_of_one_run_wait_side_by_side(tmp_path: Path, standin: StandinProcess):
    """A range in one run: every partition's batch is submitted before any has ended (one process waits for all),
    and each partition gets its own rows back."""
    raw = make_spec(tmp_path / "data", standin)
    raw["partitioning"] = {"kind": "static", "keys": ["a", "b", "c"]}
    # 25 rows a partition: more than the online window (chunks in flight x chunk_rows = 20 rows), which would start
    # the next partition only when this one has finished
    texts = {key: {f"{key}{i}": f"{COLOURS[i % 3]} {key}{i}" for i in range(25)} for key in ("a", "b", "c")}
    for key, part in texts.items():
        write_jsonl(tmp_path / "data" / f"{key}.jsonl", rows(part))
    spec = parse_spec(raw)
    outcome: dict = {}
    run = threading.Thread(target=lambda: outcome.update(
        result=run_pipeline(spec, tmp_path / "store", ["a", "c"], raise_on_error=False)))
    run.start()
    try:
        for _ in range(600):  # the clock stands still: no batch can end before all three are in
            if standin.stats()["batches_created"] == 3 or not run.is_alive():
                break
            run.join(0.1)
        stats = standin.stats()
        assert stats["batches_created"] == 3 and set(stats["statuses"]) == {"validating"}, stats["statuses"]
    finally:
        standin.advance(speed=FAST)
        run.join(300)
    assert outcome["result"].success
    for key, part in texts.items():
        assert sorted(r["doc_id"] for r in read_output(spec, tmp_path / "store", key).to_pylist()) == sorted(part)
