"""The Batch API stand-in behaves as the documented API, read through the openai SDK's own client and types: every
status, the limits and validation of an input file, an output file out of input order, an error file, partial
results on expiry and on cancel, strict parameters, and state that survives a restart."""

from __future__ import annotations

import io
import json

import openai
import pytest
from openai.types import Batch, FileObject

from tests.resources.conftest import StandinProcess, sdk_client
from tests.resources.openai_api.standin import FINALIZE_S, PER_REQUEST_S, VALIDATE_S, WINDOW_S

MODEL = "gpt-standin"


def line(custom_id: str, prompt: str, model: str = MODEL, url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}}


def upload(client: openai.OpenAI, lines: list[dict], name: str = "input.jsonl") -> FileObject:
    data = "".join(json.dumps(item) + "\n" for item in lines).encode()
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def submit(client: openai.OpenAI, lines: list[dict]) -> Batch:
    f = upload(client, lines)
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    assert file_id is not None
    return [json.loads(x) for x in client.files.content(file_id).read().splitlines()]


def test_a_batch_goes_through_every_status_and_its_results_come_back_by_custom_id(standin: StandinProcess):
    client = sdk_client(standin)
    prompts = {f"req-{i}": f"row {i}" for i in range(20)}
    prompts["req-3"] = "refuse me [[400]]"
    prompts["req-7"] = "server trouble [[500]]"
    batch = submit(client, [line(cid, p) for cid, p in prompts.items()])
    assert isinstance(batch, Batch) and batch.status == "validating"
    assert batch.expires_at == batch.created_at + WINDOW_S and batch.completion_window == "24h"

    standin.advance(VALIDATE_S + 5 * PER_REQUEST_S)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "in_progress"
    assert batch.request_counts.total == 20 and 0 < batch.request_counts.completed < 20
    assert batch.output_file_id is None  # no results before the end

    standin.advance(20 * PER_REQUEST_S)
    assert client.batches.retrieve(batch.id).status == "finalizing"
    standin.advance(FINALIZE_S)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.completed_at is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (18, 2)
    assert batch.usage is not None and batch.usage.input_tokens > 0

    output = read_lines(client, batch.output_file_id)
    ids = [item["custom_id"] for item in output]
    assert sorted(ids) == sorted(set(prompts) - {"req-3", "req-7"})
    assert ids != [cid for cid in prompts if cid in ids], "the output file must not follow the input's order"
    for item in output:
        assert item["response"]["status_code"] == 200 and item["error"] is None
        completion = openai.types.chat.ChatCompletion.model_validate(item["response"]["body"])
        assert completion.choices[0].message.content == f"echo: {prompts[item['custom_id']]}"
    errors = {item["custom_id"]: item for item in read_lines(client, batch.error_file_id)}
    assert set(errors) == {"req-3", "req-7"}
    assert errors["req-3"]["response"]["status_code"] == 400 and errors["req-7"]["response"]["status_code"] == 500
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"


def test_an_expired_batch_keeps_its_finished_requests_and_lists_the_rest_as_expired(standin: StandinProcess):
    client = sdk_client(standin)
    batch = submit(client, [line("fast-1", "one"), line("slow", "never done [[slow]]"), line("fast-2", "two")])
    standin.advance(WINDOW_S - 1)
    assert client.batches.retrieve(batch.id).status == "in_progress"  # two done, one running, an hour short
    standin.advance(1)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "expired" and batch.expired_at == batch.expires_at
    assert {x["custom_id"] for x in read_lines(client, batch.output_file_id)} == {"fast-1", "fast-2"}
    [expired] = read_lines(client, batch.error_file_id)
    assert expired["custom_id"] == "slow" and expired["response"] is None
    assert expired["error"]["code"] == "batch_expired"


def test_cancel_gives_partial_results_and_an_ended_batch_cannot_be_cancelled(standin: StandinProcess):
    client = sdk_client(standin)
    batch = submit(client, [line(f"r{i}", f"row {i}") for i in range(10)])
    standin.advance(VALIDATE_S + 3.5 * PER_REQUEST_S)
    batch = client.batches.cancel(batch.id)
    assert batch.status == "cancelling" and batch.cancelling_at is not None
    standin.advance(60)
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "cancelled"
    assert len(read_lines(client, batch.output_file_id)) == 3
    cancelled = read_lines(client, batch.error_file_id)
    assert len(cancelled) == 7 and {x["error"]["code"] for x in cancelled} == {"batch_cancelled"}

    done = submit(client, [line("x", "row")])
    standin.advance(VALIDATE_S + PER_REQUEST_S + FINALIZE_S)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)


@pytest.mark.parametrize("lines,code", [
    ([line("a", "x"), line("a", "y")], "duplicate_custom_id"),
    ([line("a", "x"), line("b", "y", model="another-model")], "mismatched_model"),
    ([line("a", "x"), line("b", "y", url="/v1/embeddings")], "mismatched_url"),
    ([line(f"r{i}", "x") for i in range(4)], "too_many_requests"),
])
def test_an_input_file_that_breaks_the_rules_fails_validation(tmp_path, lines, code):
    # limits lowered to 3 requests so a test need not build 50,000 lines; the check is the same
    proc = StandinProcess(tmp_path / "state", tmp_path / "log", "--max-requests", "3").start()
    try:
        client = sdk_client(proc)
        batch = submit(client, lines)
        proc.advance(VALIDATE_S)
        batch = client.batches.retrieve(batch.id)
        assert batch.status == "failed" and batch.failed_at is not None
        assert code in {e.code for e in batch.errors.data}, batch.errors
        assert batch.output_file_id is None
    finally:
        proc.stop()


def test_parameters_are_checked_as_strictly_as_the_api(standin: StandinProcess):
    client = sdk_client(standin)
    f = upload(client, [line("a", "x")])
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument"):
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              extra_body={"priority": "high"})
    with pytest.raises(openai.BadRequestError, match="metadata"):
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={f"k{i}": "v" for i in range(17)})
    other = client.files.create(file=("notes.jsonl", io.BytesIO(b"{}\n")), purpose="user_data")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.batches.create(input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="sk-wrong", base_url=standin.url, max_retries=0).batches.list()
    assert standin.stats()["batches_created"] == 0


def test_a_restarted_standin_keeps_its_files_batches_and_clock(standin: StandinProcess):
    client = sdk_client(standin)
    batch = submit(client, [line("a", "x"), line("b", "y")], )
    token = {"batch_assets_token": "t1"}
    tagged = client.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                                   completion_window="24h", metadata=token)
    now = standin.advance(VALIDATE_S + 1)
    standin.restart()
    assert standin.advance(0) == now
    assert client.batches.retrieve(batch.id).status == "in_progress"
    listed = list(client.batches.list(limit=1))  # paginated through, one per page
    assert [b.id for b in listed] == [tagged.id, batch.id] and listed[0].metadata == token
    assert standin.stats()["restarts"] == 1


def test_a_full_queue_of_enqueued_tokens_fails_a_batch_until_one_ends(tmp_path):
    proc = StandinProcess(tmp_path / "state", tmp_path / "log", "--enqueued-token-limit", "100").start()
    try:
        client = sdk_client(proc)
        rows = [line(f"r{i}", "x" * 40) for i in range(4)]  # 40 / 4 + max_tokens 8 = 18 tokens each
        first = submit(client, rows)  # 72 tokens
        proc.advance(VALIDATE_S)
        second = submit(client, rows[:2])  # 36 more: over 100 while the first runs
        proc.advance(VALIDATE_S)
        refused = client.batches.retrieve(second.id)
        assert refused.status == "failed" and [e.code for e in refused.errors.data] == ["token_limit_exceeded"]
        assert client.batches.retrieve(first.id).status == "finalizing"  # its tokens still count
        proc.advance(FINALIZE_S)
        assert client.batches.retrieve(first.id).status == "completed"
        third = submit(client, rows[:2])  # the queue is empty again
        proc.advance(VALIDATE_S)
        assert client.batches.retrieve(third.id).status == "in_progress"
    finally:
        proc.stop()
