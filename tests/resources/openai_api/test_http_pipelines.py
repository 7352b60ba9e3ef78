"""Pipelines whose requests really go over HTTP to an OpenAI-compatible endpoint on loopback (the fault proxy
answering by itself and recording every body): `constraint_backend: vllm` as a vLLM server receives it, and image
columns as the OpenAI provider sends them. The unit tests of the request builders (test_openai_requests.py) and
the infer stage's seam (tests/stages/test_multimodal_pipeline.py) stop short of the wire; these do not."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from PIL import Image

from batch_assets.spec import parse_spec
from tests.conftest import run_pipeline, write_jsonl
from tests.resources.openai_api.fault_proxy import FaultProxy, Reply

LABELS = ["Law Firm", "Healthcare", "Technology", "Other"]


def completion(text: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}}


def test_vllm_constraint_backend_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM server reads the constraint from `structured_outputs` in the body; it answers the bare label. One
    answer comes back off the list (as from a server that ignored the constraint): that row is an error, the others
    are published with their label."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    companies = ["Baker & Lane LLP", "St. Mary Clinic", "Quantix Cloud", "Joe's Diner"]
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"customer_id": f"c{i}", "company": c} for i, c in enumerate(companies)])

    def vllm_server(body: dict[str, Any]) -> dict[str, Any]:
        company = body["messages"][-1]["content"]
        if "Diner" in company:
            return completion("Restaurant", body)  # not a choice
        choice = body.get("structured_outputs", {}).get("choice") or ["(no constraint sent)"] * 3
        return completion(choice[0 if "LLP" in company else 1 if "Clinic" in company else 2], body)

    with FaultProxy(lambda key, n: Reply(vllm_server)) as proxy:
        spec = parse_spec({
            "name": "industries",
            "source": {"format": "jsonl", "path": f"{tmp_path}/data/{{partition}}.jsonl",
                       "columns": ["customer_id", "company"]},
            "partitioning": {"kind": "static", "keys": ["a"]},
            "prepare": {"id_column": "customer_id", "template": "{company}"},
            "task": {"kind": "generate", "params": {"max_new_tokens": 6},
                     "structured": {"choices": LABELS}, "structured_column": "industry"},
            "model": {"provider": "openai", "config": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "base_url": proxy.url,
                                                       "constraint_backend": "vllm", "send_default_api_key": True}},
            "runtime": {"max_error_fraction": 0.25},
        })
        assert run_pipeline(spec, tmp_path / "store", ["a"]).success
        bodies = [a.body for a in proxy.attempts]

    assert len(bodies) == 4  # one request per row, none retried
    for body in bodies:
        assert body["structured_outputs"] == {"choice": LABELS}
        assert "response_format" not in body and "guided_choice" not in body
    rows = {r["customer_id"]: r for r in pq.read_table(tmp_path / "store" / "industries" / "output" / "a.parquet")
            .to_pylist()}
    assert [rows[f"c{i}"]["industry"] for i in range(3)] == ["Law Firm", "Healthcare", "Technology"]
    assert all(rows[f"c{i}"]["error"] is None for i in range(3))
    assert rows["c3"]["industry"] is None and "'Restaurant' is not one of the labels" in rows["c3"]["error"]


def test_image_columns_reach_the_endpoint_as_content_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image column through the OpenAI provider over HTTP: each row's request carries its text and its image,
    decoded and resized in prepare, as a data URL; a row whose image cannot be read sends nothing and says why."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    images = tmp_path / "images"
    images.mkdir()
    for name, colour, size in (("red", (255, 0, 0), (1200, 600)), ("blue", (0, 0, 255), (300, 900))):
        Image.new("RGB", size, colour).save(images / f"{name}.png")
    write_jsonl(tmp_path / "data" / "a.jsonl", [
        {"id": "r", "image": str(images / "red.png"), "hint": "colour"},
        {"id": "b", "image": str(images / "blue.png"), "hint": "shape"},
        {"id": "m", "image": str(images / "missing.png"), "hint": "colour"},
    ])

    def describe(body: dict[str, Any]) -> dict[str, Any]:
        parts = body["messages"][-1]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        pixel = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB").getpixel((5, 5))
        return completion("red" if pixel[0] > pixel[2] else "blue", body)

    with FaultProxy(lambda key, n: Reply(describe)) as proxy:
        spec = parse_spec({
            "name": "captions",
            "source": {"format": "jsonl", "path": f"{tmp_path}/data/{{partition}}.jsonl",
                       "columns": ["id", "image", "hint"]},
            "partitioning": {"kind": "static", "keys": ["a"]},
            "prepare": {"id_column": "id", "template": "Describe this image ({hint}).", "image_columns": ["image"],
                        "image_max_side": 256},
            "task": {"kind": "generate", "params": {"max_new_tokens": 8}},
            "model": {"provider": "openai", "config": {"model": "gpt-4o-mini", "base_url": proxy.url,
                                                       "send_default_api_key": True}},
            "runtime": {"max_error_fraction": 0.5},
        })
        assert run_pipeline(spec, tmp_path / "store", ["a"]).success
        bodies = [a.body for a in proxy.attempts]

    assert len(bodies) == 2  # the row without a readable image is not sent
    by_hint = {}
    for body in bodies:
        text, image = body["messages"][-1]["content"]
        assert text["type"] == "text" and image["type"] == "image_url"
        url = image["image_url"]["url"]
        assert url.startswith("data:image/jpeg;base64,")
        sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        by_hint[text["text"]] = sent.size
    assert by_hint == {"Describe this image (colour).": (256, 128), "Describe this image (shape).": (85, 256)}
    rows = {r["id"]: r for r in pq.read_table(tmp_path / "store" / "captions" / "output" / "a.parquet").to_pylist()}
    assert (rows["r"]["generated_text"], rows["b"]["generated_text"]) == ("red", "blue")
    assert rows["m"]["generated_text"] is None and "missing.png" in rows["m"]["error"]
