"""Retries, waits, limits and secrets, through a fault-injecting proxy (in front of the real llama.cpp server where
a real completion is wanted, answering by itself where the test is about concurrency, order or payload shapes)."""

from __future__ import annotations

import email.utils
import logging
import math
import random
import time
import uuid

import dagster as dg
import numpy as np
import pytest

from batch_assets.resources.provider_errors import ProviderSetupError
from batch_assets.resources.openai_api import OpenAICompatibleProvider, UnsupportedConstraintError
from batch_assets.resources.protocols import GenerationParams
from tests.resources.openai_api.fault_proxy import Echo, FaultProxy, Forward, Malformed, Reply, Respond, Stall

# Clock stamps are taken on the proxy's side after its write returns, a hair after the client may have read the
# answer: allow that much when comparing a measured gap with the wait the server asked for.
STAMP_SLACK_S = 0.01


def provider_for(proxy: FaultProxy, **settings) -> OpenAICompatibleProvider:
    defaults = dict(model="smollm2", base_url=proxy.url, backoff_base_s=0.05, backoff_max_s=0.2)
    return OpenAICompatibleProvider(**{**defaults, **settings}).load_for_tests()


def user_rows(keys: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": k}] for k in keys]


def error_body(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def test_faults_are_retried_waits_honoured_and_every_row_accounted_for(llama_server):
    keys = [f"Row {i}: name one colour." for i in range(10)]
    http_date_target = math.ceil(time.time()) + 2  # Retry-After as an HTTP date (whole seconds)
    scripts = {
        0: lambda n: Respond(429, error_body("slow down"), {"retry-after": "1"}) if n == 1 else Forward(),
        1: lambda n: Respond(500, error_body("boom")) if n <= 2 else Forward(),
        3: lambda n: Malformed() if n == 1 else Forward(),
        4: lambda n: Respond(503, error_body("overloaded")),  # never recovers
        5: lambda n: Respond(400, error_body("'messages' is malformed")),  # not retryable
        6: lambda n: Respond(429, error_body("slow down"), {"retry-after-ms": "300"}) if n == 1 else Forward(),
        7: lambda n: (
            Respond(429, error_body("slow"), {"retry-after": email.utils.formatdate(http_date_target, usegmt=True)})
            if n == 1
            else Forward()
        ),
    }
    index = {k: i for i, k in enumerate(keys)}

    def script(key: str, n: int):
        return scripts.get(index[key], lambda n: Forward())(n)

    with FaultProxy(script, upstream=llama_server.root) as proxy:
        # A generous timeout: llama.cpp serves one request at a time and a busy machine slows it down; timeouts
        # have their own test below.
        provider = provider_for(proxy, max_concurrency=2, max_attempts=3, timeout_s=60)
        try:
            results = provider.generate(user_rows(keys), GenerationParams(max_new_tokens=6))
            stats = provider.last_call_stats
        finally:
            provider.close()

    assert len(results) == len(keys)
    failed = {4, 5}
    for i, r in enumerate(results):
        if i in failed:
            assert r.text is None and r.error, i
        else:
            assert r.error is None and r.text and r.completion_tokens, (i, r)
    assert "HTTP 503" in results[4].error and "gave up after 3 attempts" in results[4].error
    assert "HTTP 400" in results[5].error and "malformed" in results[5].error

    attempts = {i: proxy.attempts_for(k) for i, k in enumerate(keys)}
    assert {i: len(a) for i, a in attempts.items()} == {0: 2, 1: 3, 2: 1, 3: 2, 4: 3, 5: 1, 6: 2, 7: 2, 8: 1, 9: 1}
    # none duplicated: each successful row got exactly one real completion from the server
    for i in set(range(10)) - failed:
        assert [a.status for a in attempts[i] if a.action == "Forward"] == [200], i
    # the waits the server asked for were honoured
    assert attempts[0][1].arrived - attempts[0][0].finished >= 1.0 - STAMP_SLACK_S
    assert attempts[6][1].arrived - attempts[6][0].finished >= 0.3 - STAMP_SLACK_S
    assert attempts[7][1].arrived >= http_date_target - STAMP_SLACK_S
    assert proxy.max_in_flight <= 2
    assert (stats.retries, stats.rate_limited, stats.failed_rows) == (8, 3, 2)


def test_a_stalled_request_times_out_and_is_retried():
    # A stall far past the timeout, and a timeout far past a loopback answer on a busy machine: the counts below
    # depend on what the client does, not on how fast the machine is. (The proxy's stalled threads are dropped
    # when it shuts down; nobody waits 60 s.)
    def script(key: str, n: int):
        if key == "stalls once" and n == 1:
            return Stall(60)
        if key == "always stalls":
            return Stall(60)
        return Echo()

    with FaultProxy(script) as proxy:
        provider = provider_for(proxy, timeout_s=3, max_attempts=2)
        try:
            results = provider.generate(user_rows(["stalls once", "always stalls", "quick"]), GenerationParams())
        finally:
            provider.close()

    assert [r.text for r in results] == ["echo:stalls once", None, "echo:quick"]
    assert results[1].error == "request timed out after 3s (gave up after 2 attempts)"
    assert [len(proxy.attempts_for(k)) for k in ("stalls once", "always stalls", "quick")] == [2, 2, 1]


def test_in_flight_cap_and_input_order_under_random_latency():
    rng = random.Random(7)
    # answers slow enough (0.1-0.3 s) that the 5-request window fills on a loaded machine too
    delays = {f"row-{i:02d}": rng.uniform(0.1, 0.3) for i in range(40)}
    flaky = {"row-03", "row-17", "row-31"}

    def script(key: str, n: int):
        if key in flaky and n == 1:
            return Respond(502, error_body("bad gateway"))
        return Echo(delay_s=delays[key])

    with FaultProxy(script) as proxy:
        provider = provider_for(proxy, max_concurrency=5)
        try:
            results = provider.generate(user_rows(list(delays)), GenerationParams(max_new_tokens=4))
            stats = provider.last_call_stats
        finally:
            provider.close()

    assert [r.text for r in results] == [f"echo:{k}" for k in delays]  # one per row, in input order
    assert 1 < proxy.max_in_flight <= 5
    assert len(proxy.attempts) == 40 + len(flaky)
    assert (stats.retries, stats.failed_rows) == (3, 0)


def test_requests_per_minute_spaces_requests_beyond_the_burst():
    with FaultProxy(lambda key, n: Echo()) as proxy:
        # 120/min = 2 per second, with a burst of a tenth of a minute's budget (12 requests)
        provider = provider_for(proxy, max_concurrency=8, requests_per_minute=120)
        try:
            provider.generate(user_rows([f"r{i}" for i in range(16)]), GenerationParams(max_new_tokens=2))
        finally:
            provider.close()
    arrivals = sorted(a.arrived for a in proxy.attempts)
    # The 4 requests after the burst wait for half a second of budget each: the last leaves the limiter 2 s after
    # the first. Measured at the proxy the span looks a little shorter (the first requests also open connections,
    # the last reuse them), hence the margin; without the limit all 16 arrive within milliseconds.
    assert arrivals[-1] - arrivals[0] >= 1.5


def test_an_exhausted_quota_is_not_waited_for_and_fails_the_call():
    quota = {"error": {"message": "Quota exceeded", "type": "insufficient_quota", "code": "insufficient_quota"}}
    with FaultProxy(lambda key, n: Respond(429, quota, {"retry-after": "1"})) as proxy:
        provider = provider_for(proxy, max_attempts=5, max_concurrency=1)
        try:
            # no row can succeed on an exhausted quota: a setup error, not two row errors
            with pytest.raises(ProviderSetupError, match="insufficient quota.*add credit"):
                provider.generate(user_rows(["a", "b"]), GenerationParams())
        finally:
            provider.close()
    assert len(proxy.attempts) == 1  # not retried, and the other row was never sent


@pytest.mark.parametrize("status,cause", [(401, "rejected the API key"), (403, "no permission"),
                                          (404, "does not know this model")])
def test_setup_errors_fail_the_call_at_once(status, cause):
    with FaultProxy(lambda key, n: Respond(status, error_body("model 'nope' does not exist"))) as proxy:
        provider = provider_for(proxy, max_attempts=5, max_concurrency=1)
        try:
            with pytest.raises(ProviderSetupError, match=f"HTTP {status}") as caught:
                provider.generate(user_rows([f"r{i}" for i in range(6)]), GenerationParams())
        finally:
            provider.close()
    assert cause in str(caught.value)
    assert len(proxy.attempts) == 1


def test_regex_is_refused_before_any_request():
    with FaultProxy(lambda key, n: Echo()) as proxy:
        provider = provider_for(proxy)
        try:
            with pytest.raises(UnsupportedConstraintError, match="regex"):
                provider.generate(user_rows(["a"]), GenerationParams(regex=r"\d+"))
        finally:
            provider.close()
    assert proxy.attempts == []


def responses_payload(body: dict) -> dict:
    """A valid Responses API answer (llama.cpp's server has no /v1/responses, so the proxy plays OpenAI)."""
    text = '{"label": "Retail"}' if "text" in body else "echo:" + body["input"][-1]["content"]
    return {
        "id": "resp_" + uuid.uuid4().hex,
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": body["model"],
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 11,
            "output_tokens": 3,
            "total_tokens": 14,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def test_responses_api_text_usage_and_structured_format():
    def script(key: str, n: int):
        return Respond(500, error_body("flaky")) if (key == "b" and n == 1) else Reply(responses_payload)

    with FaultProxy(script) as proxy:
        provider = provider_for(proxy, api="responses")
        try:
            plain = provider.generate(user_rows(["a", "b", "c"]), GenerationParams(max_new_tokens=8))
            labelled = provider.generate(user_rows(["d"]), GenerationParams(choices=("Retail", "Finance")))
        finally:
            provider.close()

    assert [g.text for g in plain] == ["echo:a", "echo:b", "echo:c"]
    assert all((g.prompt_tokens, g.completion_tokens) == (11, 3) for g in plain)
    assert labelled[0].text == "Retail"
    assert {a.path for a in proxy.attempts} == {"/v1/responses"}
    sent = proxy.attempts_for("d")[0].body
    assert sent["text"]["format"]["type"] == "json_schema"
    assert sent["text"]["format"]["schema"]["properties"]["label"]["enum"] == ["Retail", "Finance"]
    assert sent["max_output_tokens"] >= 16 and sent["store"] is False


def embeddings_payload(body: dict) -> dict:
    vectors = [[float(len(text)), float(i), 1.0] for i, text in enumerate(body["input"])]
    # answered out of order on purpose: `index` says where each vector belongs
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)][::-1]
    return {"object": "list", "model": body["model"], "data": data, "usage": {"prompt_tokens": 5, "total_tokens": 5}}


def test_embed_batches_retries_and_keeps_order():
    texts = [f"text number {i}" + "!" * i for i in range(10)]

    def script(key: str, n: int):
        if key == texts[4] and n == 1:
            return Respond(429, error_body("slow down"), {"retry-after": "0.2"})
        return Reply(embeddings_payload)

    with FaultProxy(script) as proxy:
        provider = provider_for(proxy, embedding_model="embedder", embedding_batch_size=4)
        try:
            vectors = provider.embed(texts)
        finally:
            provider.close()

    assert vectors.dtype == np.float32 and vectors.shape == (10, 3)
    assert vectors[:, 0].tolist() == [float(len(t)) for t in texts]
    assert sorted(len(a.body["input"]) for a in proxy.attempts if a.status == 200) == [2, 4, 4]
    assert len(proxy.attempts) == 4  # three batches, one retried
    assert {a.body["model"] for a in proxy.attempts} == {"embedder"}


def test_the_api_key_never_appears_in_metadata_logs_or_errors(monkeypatch, caplog, capfd):
    secret = "sk-test-" + uuid.uuid4().hex
    monkeypatch.setenv("PROVIDER_TEST_OPENAI_KEY", secret)
    caplog.set_level(logging.DEBUG)

    def script(key: str, n: int):
        if key == "rejected":  # what OpenAI does: echo the key it refused
            return Respond(401, error_body(f"Incorrect API key provided: {secret}."))
        if key == "bad":
            return Respond(400, error_body(f"unexpected value near {secret}"))
        if key == "flaky" and n == 1:
            return Respond(500, error_body(f"upstream said {secret}"))
        return Echo()

    errors: list[str | None] = []

    @dg.asset
    def answers(llm: OpenAICompatibleProvider) -> dg.MaterializeResult:
        results = llm.generate(user_rows(["bad", "flaky", "fine"]), GenerationParams(max_new_tokens=4))
        errors.extend(r.error for r in results)
        llm.generate(user_rows(["rejected"]), GenerationParams(max_new_tokens=4))  # a 401 fails the step
        return dg.MaterializeResult(metadata={**llm.describe(), "errors": [e or "" for e in errors]})

    with FaultProxy(script) as proxy, dg.instance_for_test() as instance:
        provider = OpenAICompatibleProvider(
            model="gpt-test", base_url=proxy.url, api_key=dg.EnvVar("PROVIDER_TEST_OPENAI_KEY"), backoff_base_s=0.01
        )
        result = dg.materialize([answers], resources={"llm": provider}, instance=instance, raise_on_error=False)
        event_text = "\n".join(str(record) for record in instance.all_logs(result.run_id))

    assert not result.success
    assert proxy.attempts[0].authorization == f"Bearer {secret}"  # the key was really used...
    assert "HTTP 400" in errors[0] and errors[1] is None and errors[2] is None
    assert "HTTP 401" in event_text and "OPENAI_API_KEY" in event_text
    captured = capfd.readouterr()
    # ...and appears nowhere a person or a log store would see it
    for where, text in {
        "row errors": "\n".join(e or "" for e in errors),
        "describe()": repr(provider.describe()),
        "repr(provider)": repr(provider),
        "Dagster event log": event_text,
        "python logs": caplog.text,
        "stdout/stderr": captured.out + captured.err,
    }.items():
        assert secret not in text, where
