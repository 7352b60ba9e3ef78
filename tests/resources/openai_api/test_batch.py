"""OpenAI's Batch API as the provider side of the batch path (resources/openai_api/batch.py), read through the real
SDK against the strict stand-in (tests/resources/openai_api/standin.py): the documented request line, results collected by
custom_id and each one classified (answer, row error, transient, never ran), a whole batch refused for a reason that
passes vs one that does not, a results file that is not one, and the setup errors that name their fix.

Money and rows: a transient outcome read as a row error loses the row (published as failed when a retry would have
answered it); a row error read as transient pays again for an answer that will not change; a results line dropped
or read under another custom_id attaches an answer to the wrong row."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from batch_assets.resources.provider_errors import ProviderSetupError
from batch_assets.resources.openai_api import OpenAICompatibleProvider
from batch_assets.resources.openai_api.batch import TOKEN_KEY, OpenAIBatches
from batch_assets.resources.openai_api.retry import MalformedResponse
from batch_assets.resources.protocols import BatchState, GenerationParams
from tests.resources.conftest import API_KEY, StandinProcess, sdk_client
from tests.resources.openai_api.standin import FINALIZE_S, PER_REQUEST_S, VALIDATE_S, WINDOW_S

MODEL = "gpt-standin"
PARAMS = GenerationParams(max_new_tokens=8)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandinProcess]:
    with _running_standin(tmp_path) as proc:
        yield proc


@pytest.fixture
def provider(standin: StandinProcess) -> Iterator[OpenAICompatibleProvider]:
    with _provider(standin) as p:
        yield p


def conversation(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def submit(session: OpenAIBatches, prompts: dict[str, str]) -> str:
    data = b"".join(session.request_line(cid, conversation(p)) for cid, p in prompts.items())
    sub = SimpleNamespace(token=f"tok-{time.time_ns()}", created=time.time(), file_id=None)
    sub.file_id = session.upload("input.jsonl", data)
    return session.create(sub, data)


def finish(standin: StandinProcess, rows: int) -> None:
    standin.advance(VALIDATE_S + rows * PER_REQUEST_S + FINALIZE_S + 1)


def test_each_row_is_the_documented_line_and_its_result_comes_back_under_its_own_custom_id(standin, provider):
    session = provider.batch_session(PARAMS)
    line = json.loads(session.request_line("row-1", conversation("café")))
    # https://platform.openai.com/docs/api-reference/batch/request-input: {custom_id, method, url, body}
    assert set(line) == {"custom_id", "method", "url", "body"}
    assert (line["custom_id"], line["method"], line["url"]) == ("row-1", "POST", "/v1/chat/completions")
    assert line["body"]["model"] == MODEL and line["body"]["messages"] == conversation("café")
    assert "café" in session.request_line("row-1", conversation("café")).decode()  # UTF-8, not \u escapes
    assert session.request_line("x", conversation("a")).endswith(b"\n")

    prompts = {f"row-{i}": f"text {i}" for i in range(12)}
    prompts["row-3"] = "refuse me [[400]]"
    prompts["row-7"] = "server trouble [[500]]"
    batch_id = submit(session, prompts)
    assert batch_id in session.active  # a user's stop cancels what this process waits on
    state = session.state(batch_id)
    assert not state.ended and state.status == "validating"

    finish(standin, len(prompts))
    state = session.state(batch_id)
    assert state.ended and state.status == "completed" and batch_id not in session.active
    assert (state.total, state.completed, state.failed) == (12, 10, 2)
    assert len(state.files) == 2  # the output file and the error file

    results = list(session.results(state))
    assert sorted(cid for cid, _ in results) == sorted(prompts)  # each row exactly once, whatever the files' order
    outcome = dict(results)
    for cid, prompt in prompts.items():
        if cid in ("row-3", "row-7"):
            continue
        assert outcome[cid].error is None and outcome[cid].answer.text == f"echo: {prompt}", outcome[cid]
    refused, transient = outcome["row-3"], outcome["row-7"]
    assert refused.answer is None and refused.error.startswith("HTTP 400") and "refused" in refused.error
    assert not refused.retryable and not refused.unfinished  # a deterministic refusal: a row error, not paid again
    assert transient.error.startswith("HTTP 500") and transient.retryable and not transient.unfinished


def test_requests_a_batch_never_ran_come_back_unfinished_and_are_asked_again(standin, provider):
    session = provider.batch_session(PARAMS)
    batch_id = submit(session, {"done": "quick", "stuck": "never ends [[slow]]"})
    standin.advance(WINDOW_S + 1)
    state = session.state(batch_id)
    assert state.ended and state.status == "expired"
    outcome = dict(session.results(state))
    assert outcome["done"].answer.text == "echo: quick"
    assert outcome["stuck"].answer is None and outcome["stuck"].unfinished and outcome["stuck"].retryable
    assert "batch_expired" in outcome["stuck"].error


def test_cancelling_a_batch_that_has_ended_is_no_error(standin, provider):
    session = provider.batch_session(PARAMS)
    batch_id = submit(session, {"a": "one"})
    finish(standin, 1)
    assert session.state(batch_id).status == "completed"
    session.active.add(batch_id)
    session.cancel(batch_id)  # the stand-in answers 409, as OpenAI does for an ended batch
    assert batch_id not in session.active
    assert standin.calls("POST /v1/batches/{batch_id}/cancel") == 1  # said once, not retried as a lock conflict


def test_a_batch_is_found_again_by_the_token_it_carries(standin, provider):
    """A create whose answer was lost: the batch is looked up by its token, never created a second time."""
    session = provider.batch_session(PARAMS)
    data = session.request_line("a", conversation("one"))
    sub = SimpleNamespace(token="tok-lost", created=time.time(), file_id=session.upload("in.jsonl", data))
    created = session.create(sub, data)
    session.active.clear()
    assert sdk_client(standin).batches.retrieve(created).metadata == {TOKEN_KEY: "tok-lost"}
    assert session.find_batch(sub) == created and created in session.active
    assert session.find_batch(SimpleNamespace(token="tok-other", created=time.time())) is None


def test_a_batch_refused_for_the_token_queue_is_retried_later_one_refused_for_its_file_is_not(tmp_path: Path):
    with _running_standin(tmp_path, "--enqueued-token-limit", "40") as standin, _provider(standin) as p:
        session = p.batch_session(PARAMS)
        big = submit(session, {f"r{i}": "many words " * 20 for i in range(5)})
        standin.advance(VALIDATE_S + 1)
        state = session.state(big)
        assert state.ended and state.status == "failed"
        assert state.retry_later and "token_limit_exceeded" in state.failure  # the queue empties: rows go again

        # a file whose lines name two models is refused for what it is: sending it again cannot help
        lines = session.request_line("a", conversation("x")) + json.dumps(
            {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "other-model", "messages": conversation("y")}}).encode() + b"\n"
        sub = SimpleNamespace(token="t2", created=time.time(), file_id=session.upload("two.jsonl", lines))
        wrong = session.create(sub, lines)
        standin.advance(VALIDATE_S + 1)
        state = session.state(wrong)
        assert state.status == "failed" and not state.retry_later
        assert "mismatched_model" in state.failure, state.failure  # the user is told what is wrong with the file


def test_a_batch_unknown_to_the_endpoint_says_how_to_start_the_partition_over(standin, provider):
    session = provider.batch_session(PARAMS)
    with pytest.raises(ProviderSetupError, match="batch_nope.*unknown to this endpoint") as caught:
        session.state("batch_nope")
    assert "inferred-batches" in caught.value.fix and "paid again" in caught.value.fix


def _result_file(standin: StandinProcess, lines: list[object]) -> str:
    data = b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)
    return sdk_client(standin).files.create(file=("output.jsonl", io.BytesIO(data)), purpose="batch").id


def _line(custom_id: str, status: int | None, body: object = None, error: object = None) -> dict:
    response = None if status is None else {"status_code": status, "request_id": "req", "body": body}
    return {"id": f"batch_req_{custom_id}", "custom_id": custom_id, "response": response, "error": error}


def _completion(text: str | None, refusal: str | None = None) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text,
                                                                          "refusal": refusal}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_every_kind_of_result_line_is_classified_and_the_key_never_shows(standin, provider):
    session = provider.batch_session(PARAMS)
    leak = {"error": {"message": f"Incorrect API key provided: {API_KEY}", "type": "server_error"}}
    file_id = _result_file(standin, [
        _line("ok", 200, _completion("yes")),
        b"",  # a blank line is not a result
        _line("refused", 200, _completion(None, refusal="I can't")),
        _line("truncated", 200, {"object": "chat.completion"}),  # a 200 that is not a completion
        _line("rate", 429, {"error": {"message": "slow down", "type": "rate_limit"}}),
        _line("timeout", 408, {"error": {"message": "timed out"}}),
        _line("bad", 400, {"error": {"message": "max_tokens is too large"}}),
        _line("leaky", 502, leak),
        _line("cancelled", None, error={"code": "batch_cancelled", "message": "cancelled before it ran"}),
    ])
    state = BatchState(id="batch_x", status="completed", ended=True, files=(file_id,))
    outcome = dict(session.results(state))
    assert set(outcome) == {"ok", "refused", "truncated", "rate", "timeout", "bad", "leaky", "cancelled"}
    assert outcome["ok"].answer.text == "yes" and outcome["ok"].answer.prompt_tokens == 3
    assert outcome["refused"].answer.error == "the model returned no text (refused: I can't)"  # the row's error
    assert outcome["truncated"].retryable and "malformed response" in outcome["truncated"].error
    assert outcome["rate"].retryable and outcome["timeout"].retryable and outcome["leaky"].retryable
    assert not outcome["bad"].retryable and "max_tokens is too large" in outcome["bad"].error
    assert API_KEY not in outcome["leaky"].error and "[redacted]" in outcome["leaky"].error
    assert outcome["cancelled"].unfinished and outcome["cancelled"].retryable


@pytest.mark.parametrize(("status", "fix"), [(401, "api_key"), (403, "permission"), (404, "base_url")])
def test_a_result_line_that_says_the_setup_is_wrong_fails_the_partition(standin, provider, status, fix):
    """Every other row would get the same answer: the step fails naming the fix instead of publishing row errors."""
    session = provider.batch_session(PARAMS)
    file_id = _result_file(standin, [_line("a", status, {"error": {"message": f"no ({API_KEY})"}})])
    with pytest.raises(ProviderSetupError) as caught:
        list(session.results(BatchState(id="b", status="completed", ended=True, files=(file_id,))))
    assert caught.value.status == status and fix in caught.value.fix and API_KEY not in str(caught.value)


def test_a_results_file_that_is_not_one_names_the_batch_file_and_line(standin, provider):
    session = provider.batch_session(PARAMS)
    file_id = _result_file(standin, [_line("a", 200, _completion("yes")), b"{not json", _line("b", 200,
                                                                                             _completion("no"))])
    with pytest.raises(MalformedResponse, match=f"line 2 of batch batch_y's file {file_id}"):
        list(session.results(BatchState(id="batch_y", status="completed", ended=True, files=(file_id,))))


def test_embedding_lines_carry_one_text_and_vectors_of_another_size_are_row_errors(standin: StandinProcess):
    with _provider(standin, dimensions=4, embedding_model="emb-standin") as p:
        session = p.batch_session(None, method="embed")
        line = json.loads(session.request_line("e1", "some text"))
        assert line["url"] == "/v1/embeddings" == session.endpoint
        assert line["body"] == {"model": "emb-standin", "encoding_format": "float", "dimensions": 4,
                                "input": "some text"}
        vector = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 1, 2, 3]}],
                  "usage": {"prompt_tokens": 2, "total_tokens": 2}}
        short = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 1]}]}
        two = {"object": "list", "data": [vector["data"][0], vector["data"][0]]}
        file_id = _result_file(standin, [_line("ok", 200, vector), _line("short", 200, short),
                                         _line("two", 200, two)])
        outcome = dict(session.results(BatchState(id="b", status="completed", ended=True, files=(file_id,))))
        assert outcome["ok"].answer.dtype == np.float32 and outcome["ok"].answer.tolist() == [0.5, 1, 2, 3]
        assert outcome["ok"].prompt_tokens == 2
        assert "of 4 numbers" in outcome["short"].error and not outcome["short"].retryable
        assert "one vector" in outcome["two"].error and outcome["two"].retryable  # malformed: asked again


def test_an_endpoint_without_the_files_api_says_to_send_online(llama_server):
    """llama.cpp's OpenAI-compatible server (the real one) has no /v1/files, as vLLM's has none."""
    p = OpenAICompatibleProvider(model="smollm2", base_url=llama_server.base_url, batch_api=True,
                                 max_attempts=1).load_for_tests()
    try:
        with pytest.raises(ProviderSetupError, match="no /v1/files") as caught:
            p.batch_session(PARAMS).upload("in.jsonl", b"{}\n")
        assert "batch_api: false" in caught.value.fix
    finally:
        p.close()


@contextmanager
def _running_standin(tmp_path: Path, *args: str, module: str = "tests.resources.openai_api.standin") -> Iterator[StandinProcess]:
    proc = StandinProcess(tmp_path / f"state-{module}", tmp_path / f"{module}.log", *args, module=module).start()
    try:
        yield proc
    finally:
        proc.stop()


@contextmanager
def _provider(standin: StandinProcess, **fields: object) -> Iterator[OpenAICompatibleProvider]:
    p = OpenAICompatibleProvider(model=MODEL, base_url=standin.url, api_key=API_KEY, batch_api=True, max_attempts=1,
                                 **fields).load_for_tests()
    try:
        yield p
    finally:
        p.close()
