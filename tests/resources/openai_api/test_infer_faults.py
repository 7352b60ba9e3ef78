"""The whole pipeline against an OpenAI-compatible endpoint behind the fault-injecting proxy: faults become retries or
recorded row errors (never lost or repeated rows), setup errors fail the step at once, the error-rate check blocks
publishing, and the request window stays full across chunk boundaries."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest

from tests.conftest import make_spec, run_pipeline, write_jsonl
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy, Forward, Malformed, Respond, Stall

SPEC: dict[str, Any] = {
    "name": "answers",
    "source": {"format": "jsonl", "path": "PLACEHOLDER/{partition}.jsonl", "columns": ["doc_id", "text"]},
    "partitioning": {"kind": "static", "keys": ["a"]},
    "prepare": {"id_column": "doc_id", "template": "{text}"},
    "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
    "model": {"provider": "openai", "config": {"model": "smollm2"}},
    "runtime": {"chunk_rows": 4},
}


def _spec(tmp_path: Path, proxy: FaultProxy, rows: int, runtime: dict | None = None, **config: Any):
    texts = [f"Row {i}: name one colour." for i in range(rows)]
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"doc_id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    model = {"provider": "openai", "config": {"model": "smollm2", "base_url": proxy.url, "backoff_base_s": 0.05,
                                              "backoff_max_s": 0.2, **config}}
    return make_spec(SPEC, tmp_path / "data", model=model, runtime={"chunk_rows": 4, **(runtime or {})}), texts


def _failure_text(result) -> str:
    return "\n".join(str(e.event_specific_data.error) for e in result.all_events if e.event_type_value == "STEP_FAILURE")


def _checks(result) -> dict[str, bool]:
    return {e.event_specific_data.check_name: e.event_specific_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


@pytest.mark.parametrize("status,cause", [(401, "rejected the API key"), (404, "does not know this model")])
def test_setup_errors_fail_the_step_fast_and_publish_nothing(tmp_path: Path, status: int, cause: str) -> None:
    body = {"error": {"message": "The model `smollm2` does not exist", "type": "invalid_request_error"}}
    with FaultProxy(lambda key, n: Respond(status, body)) as proxy:
        spec, _ = _spec(tmp_path, proxy, rows=24, max_concurrency=2, max_attempts=5)
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    text = _failure_text(result)
    assert f"HTTP {status}" in text and cause in text and "What to do" in text and "nothing was published" in text
    # fast: never retried, and the rows queued behind the first answers were not sent (24 rows x 5 attempts otherwise)
    assert len(proxy.attempts) <= 4
    assert not (tmp_path / "store" / "answers" / "output").exists()


NO_WAIT_RETRY = {"max_retries": 1, "delay_seconds": 0, "jitter": False}


def test_every_row_failing_alike_fails_the_step(tmp_path: Path) -> None:
    # an outage that outlasts the step's retries: retried once (it may pass), then the step fails
    with FaultProxy(lambda key, n: Respond(503, {"error": {"message": "overloaded"}})) as proxy:
        spec, _ = _spec(tmp_path, proxy, rows=8, max_concurrency=4, max_attempts=2)
        spec = spec.model_copy(update={"retries": spec.retries.model_copy(update=NO_WAIT_RETRY)})
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success
    assert "failed the same way: HTTP 503" in _failure_text(result) and "looks transient" in _failure_text(result)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
    assert not (tmp_path / "store" / "answers" / "output").exists()


def test_the_same_400_for_every_row_is_not_retried(tmp_path: Path) -> None:
    with FaultProxy(lambda key, n: Respond(400, {"error": {"message": "max_tokens is too large"}})) as proxy:
        spec, _ = _spec(tmp_path, proxy, rows=8, max_concurrency=4, max_attempts=2)
        spec = spec.model_copy(update={"retries": spec.retries.model_copy(update=NO_WAIT_RETRY)})
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert not result.success and "failed the same way: HTTP 400" in _failure_text(result)
    assert "STEP_UP_FOR_RETRY" not in [e.event_type_value for e in result.all_events]


def test_an_outage_that_ends_is_survived_by_the_step_retry_without_repeating_finished_chunks(tmp_path: Path) -> None:
    def script(key: str, n: int):
        # rows of chunk 2 (8..11) meet an outage that lasts both of the provider's attempts (n = 1, 2): the whole
        # chunk fails alike, the step is retried, and by then (n = 3) the endpoint is back
        late = int(key.split(":")[0].split()[1]) >= 8
        return Respond(503, {"error": {"message": "overloaded"}}) if late and n <= 2 else Echo()

    with FaultProxy(script) as proxy:
        spec, texts = _spec(tmp_path, proxy, rows=12, max_concurrency=1, max_attempts=2)
        spec = spec.model_copy(update={"retries": spec.retries.model_copy(update=NO_WAIT_RETRY)})
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
    assert result.success, _failure_text(result)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 1
    rows = pq.read_table(tmp_path / "store" / "answers" / "output" / "a.parquet").to_pylist()
    assert sorted(r["doc_id"] for r in rows) == sorted(f"d{i}" for i in range(12))
    assert all(r["error"] is None and r["generated_text"] == f"echo:{texts[int(r['doc_id'][1:])]}" for r in rows)
    # chunks 0 and 1 were committed before the outage: the retry did not send their rows again
    for i in range(8):
        assert len(proxy.attempts_for(texts[i])) == 1, texts[i]
    for i in range(8, 12):
        assert len(proxy.attempts_for(texts[i])) == 3, texts[i]


def test_too_many_row_errors_fail_the_blocking_check_and_block_publish(tmp_path: Path) -> None:
    refused = {"Row 1: name one colour.", "Row 5: name one colour.", "Row 9: name one colour."}

    def script(key: str, n: int):
        return Respond(400, {"error": {"message": "content policy"}}) if key in refused else Echo()

    with FaultProxy(script) as proxy:
        spec, _ = _spec(tmp_path, proxy, rows=10)
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
        assert not result.success
        assert _checks(result) == {"no_row_errors": False, "rows_exactly_once": True, "error_rate": False,
                                   "output_schema": True}
        assert not (tmp_path / "store" / "answers" / "output").exists()

        # the same partition under a threshold that admits 3 of 10: published, the errors recorded per row
        lenient, _ = _spec(tmp_path, proxy, rows=10, runtime={"max_error_fraction": 0.3})
        assert run_pipeline(lenient, tmp_path / "store", ["a"]).success
    rows = pq.read_table(tmp_path / "store" / "answers" / "output" / "a.parquet").to_pylist()
    assert sorted(r["doc_id"] for r in rows if r["error"]) == ["d1", "d5", "d9"]
    assert all("HTTP 400" in r["error"] for r in rows if r["error"])


def test_the_request_window_spans_chunk_boundaries(tmp_path: Path) -> None:
    # answers of 0.2-0.6 s: long enough that the window fills and chunks overlap on a loaded machine too
    with FaultProxy(lambda key, n: Echo(delay_s=0.2 + (zlib.crc32(key.encode()) % 5) / 10)) as proxy:
        spec, texts = _spec(tmp_path, proxy, rows=40, max_concurrency=6)
        assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    chunk_of = {t: i // 4 for i, t in enumerate(texts)}
    last_finish = {}
    for a in proxy.attempts:
        last_finish[chunk_of[a.key]] = max(last_finish.get(chunk_of[a.key], 0), a.finished)
    overlapped = sum(1 for a in proxy.attempts if chunk_of[a.key] > 0 and a.arrived < last_finish[chunk_of[a.key] - 1])
    # a barrier per chunk would make this 0: no request of chunk k+1 before chunk k's last answer
    assert overlapped >= 9
    assert proxy.max_in_flight == 6  # full window, never more than max_concurrency
    rows = pq.read_table(tmp_path / "store" / "answers" / "output" / "a.parquet").to_pylist()
    assert [r["generated_text"] for r in rows] == [f"echo:{t}" for t in texts]  # in order, one each


KEYS = ["a", "b", "c", "d"]


def _partitioned_spec(tmp_path: Path, proxy: FaultProxy, rows: int, **config: Any):
    texts = {k: [f"Row {k}{i}: name one colour." for i in range(rows)] for k in KEYS}
    for k in KEYS:
        write_jsonl(tmp_path / "data" / f"{k}.jsonl", [{"doc_id": f"{k}{i}", "text": t} for i, t in enumerate(texts[k])])
    model = {"provider": "openai", "config": {"model": "smollm2", "base_url": proxy.url, "backoff_base_s": 0.05,
                                              "backoff_max_s": 0.2, **config}}
    spec = make_spec(SPEC, tmp_path / "data", model=model, runtime={"chunk_rows": 4},
                     partitioning={"kind": "static", "keys": KEYS}, retries={"max_retries": 0})
    return spec, texts


def _materialized(result, stage: str) -> dict[str, dict]:
    return {e.event_specific_data.materialization.partition: e.event_specific_data.materialization.metadata
            for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
            and e.event_specific_data.materialization.asset_key.path[-1] == stage}


def test_the_request_window_spans_partition_boundaries(tmp_path: Path) -> None:
    """Four partitions of 6 rows in one run at max_concurrency 12: one at a time, a partition's 6 rows were all that
    could be in flight and each partition drained before the next began; overlapped, the window is full."""
    with FaultProxy(lambda key, n: Echo(delay_s=0.3)) as proxy:
        spec, texts = _partitioned_spec(tmp_path, proxy, rows=6, max_concurrency=12)
        result = run_pipeline(spec, tmp_path / "store", KEYS)
        assert result.success
    assert 6 < proxy.max_in_flight <= 12  # more than one partition's rows at once, never more than max_concurrency
    part_of = {t: k for k in KEYS for t in texts[k]}
    last_answer = {k: max(a.finished for a in proxy.attempts if part_of[a.key] == k) for k in KEYS}
    assert any(part_of[a.key] == "b" and a.arrived < last_answer["a"] for a in proxy.attempts)
    metadata = _materialized(result, "inferred")
    for k in KEYS:  # each partition's own rows, file and counts, though they ran at once
        rows = pq.read_table(tmp_path / "store" / "answers" / "output" / f"{k}.parquet").to_pylist()
        assert [r["generated_text"] for r in rows] == [f"echo:{t}" for t in texts[k]]
        assert metadata[k]["requests"].value == 6 and metadata[k]["dagster/row_count"].value == 6
    assert len(proxy.attempts) == 24


def test_a_partition_failing_among_overlapping_ones_fails_the_step_and_keeps_the_others(tmp_path: Path) -> None:
    def script(key: str, n: int):
        if key.startswith("Row b"):  # partition b: the endpoint refuses every row alike
            return Respond(400, {"error": {"message": "max_tokens is too large"}})
        return Echo(delay_s=0.2)

    with FaultProxy(script) as proxy, dg.instance_for_test() as instance:
        spec, texts = _partitioned_spec(tmp_path, proxy, rows=6, max_concurrency=12, max_attempts=1)
        result = run_pipeline(spec, tmp_path / "store", KEYS, instance=instance, raise_on_error=False)
        assert not result.success and "failed the same way: HTTP 400" in _failure_text(result)
        # the partitions running beside b were finished (their requests were paid for) and recorded as materialized
        assert instance.get_materialized_partitions(dg.AssetKey(["answers", "inferred"])) == {"a", "c", "d"}
    for k in ("a", "c", "d"):
        assert pq.read_table(tmp_path / "store" / "answers" / "inferred" / f"{k}.parquet").num_rows == 6
    assert not (tmp_path / "store" / "answers" / "inferred" / "b.parquet").exists()
    assert not (tmp_path / "store" / "answers" / "output").exists()


def _warm_up(server) -> None:
    import json
    import urllib.request

    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(server.base_url + "/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()


@pytest.mark.slow
def test_fault_storm_against_the_real_llama_server(tmp_path: Path, llama_server) -> None:
    """429 storms with Retry-After, ~20% 500s, a timeout and a malformed body in front of the real llama.cpp server,
    and one row whose endpoint stays down through all its attempts: that row is owed an answer, not a row error, so
    the partition is not published; once the endpoint is back a rerun asks only that row. Every row ends with its
    answer, no row is answered twice."""
    down = {"row 7": True}

    def script(key: str, n: int):
        i = int(key.split()[1].rstrip(":"))
        if i == 7 and down["row 7"]:
            return Respond(503, {"error": {"message": "overloaded"}})  # transient, never recovers in the first run
        if n == 1:
            return Respond(429, {"error": {"message": "slow down"}}, {"retry-after": "0.3"})  # every row, once
        if n == 2 and i % 5 == 0:
            return Respond(500, {"error": {"message": "boom"}})  # 20% of rows
        if n == 2 and i == 3:
            return Stall(16.0)  # past timeout_s: retried
        if n == 2 and i == 4:
            return Malformed()
        return Forward()

    _warm_up(llama_server)  # a cold server's first answer can outlast timeout_s: that retry would be a real repeat
    with FaultProxy(script, upstream=llama_server.root) as proxy:
        spec, texts = _spec(tmp_path, proxy, rows=10, runtime={"max_error_fraction": 0.1},
                            max_concurrency=2, max_attempts=4, timeout_s=15.0)
        spec = spec.model_copy(update={"retries": spec.retries.model_copy(update={"max_retries": 0})})
        first = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)
        assert not first.success
        failure = _failure_text(first)
        assert "1 row(s) got no answer" in failure and "d7: HTTP 503" in failure, failure
        assert "a rerun asks the model only for these 1 row(s)" in failure, failure
        assert not (tmp_path / "store" / "answers" / "output" / "a.parquet").exists()  # not published
        down["row 7"] = False  # the endpoint is back
        sent_before = {i: len(proxy.attempts_for(t)) for i, t in enumerate(texts)}
        result = run_pipeline(spec, tmp_path / "store", ["a"], raise_on_error=False)

    assert result.success, _failure_text(result)
    rows = pq.read_table(tmp_path / "store" / "answers" / "output" / "a.parquet").to_pylist()
    assert sorted(r["doc_id"] for r in rows) == sorted(f"d{i}" for i in range(10))  # none lost, none repeated
    for r in rows:
        assert r["error"] is None and r["generated_text"], r
    for i, t in enumerate(texts):
        forwarded_ok = [a for a in proxy.attempts_for(t) if a.action == "Forward" and a.status == 200]
        assert len(forwarded_ok) == 1, i  # each answer paid for once, over both runs
        asked_again = len(proxy.attempts_for(t)) - sent_before[i]
        assert asked_again == (1 if i == 7 else 0), i  # the rerun asked only the owed row
    assert proxy.max_in_flight <= 2 + 1  # the stalled request lingers at the proxy after the client gave up
