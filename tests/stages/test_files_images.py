"""Images from a files source: pictures made with Pillow in a local folder or under an S3 prefix (moto) go into
`embed_image` / `classify_image` (the `image` provider with a small user torch module) and into multimodal prompts
(image parts sent over HTTP to an OpenAI-compatible endpoint on loopback), decoded and resized chunk by chunk. A
file that does not decode is a row error naming the file; every file is out once."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from batch_assets.spec import parse_spec
from tests.conftest import run_pipeline
from tests.resources.openai_api.fault_proxy import FaultProxy, Reply
from tests.stages.test_files_documents import completion
from tests.stages.test_image_pipelines import BLUE, RED, net, picture  # noqa: F401 (net: the fixture)

KEY = "shard-00-of-01"


def pictures(folder: Path) -> dict[str, Path]:
    """Three red and three blue pictures (PNG and JPEG), a text file named like a picture, a truncated PNG and an
    empty file."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for i in range(3):
        made[f"red-{i}.png"] = Path(picture(folder / f"red-{i}.png", RED, 10 + i))
        made[f"blue-{i}.jpg"] = Path(picture(folder / f"blue-{i}.jpg", BLUE, 20 + i))
    (folder / "notes.png").write_text("these are not pixels")
    made["notes.png"] = folder / "notes.png"
    whole = made["red-0.png"].read_bytes()
    (folder / "cut.png").write_bytes(whole[: len(whole) // 2])
    made["cut.png"] = folder / "cut.png"
    (folder / "empty.png").write_bytes(b"")
    made["empty.png"] = folder / "empty.png"
    return made


BAD = ("notes.png", "cut.png", "empty.png")


def image_spec(path: str, task: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "photos",
        "source": {"format": "files", "path": path},
        "partitioning": {"kind": "hash", "count": 1},
        "prepare": {"image_columns": ["file_path"], "image_max_side": 64},
        "task": task,
        "model": model,
        "runtime": {"max_error_fraction": 0.4, "chunk_rows": 3},
    }


def output(store: Path) -> dict[str, dict[str, Any]]:
    return {r["row_id"]: r for r in pq.read_table(store / "photos" / "output" / f"{KEY}.parquet").to_pylist()}


def check_bad_rows(rows: dict[str, dict[str, Any]], where: str, column: str) -> None:
    for name in BAD:
        assert rows[name][column] is None
        assert rows[name]["error"].startswith("image could not be read: ") and f"{where}/{name}" in rows[name]["error"]
        assert "not an image Pillow can decode" in rows[name]["error"]


def test_a_folder_of_pictures_is_classified_and_embedded(tmp_path: Path, net: str) -> None:  # noqa: F811
    made = pictures(tmp_path / "photos")
    examples = {"red": [picture(tmp_path / f"ex-red{s}.png", RED, s) for s in range(2)],
                "blue": [picture(tmp_path / f"ex-blue{s}.png", BLUE, s) for s in range(2)]}
    classify = parse_spec(image_spec(f"{tmp_path}/photos/*", {"kind": "classify_image", "labels": ["red", "blue"]},
                                     {"provider": "image", "config": {"torch_module": net, "image_size": 32,
                                                                      "label_examples": examples}}))
    assert run_pipeline(classify, tmp_path / "store", [KEY]).success
    rows = output(tmp_path / "store")
    assert sorted(rows) == sorted(made)  # every file once
    assert {name: rows[name]["label"] for name in made if name not in BAD} == {
        name: name.split("-")[0] for name in made if name not in BAD}
    check_bad_rows(rows, f"{tmp_path}/photos", "label")

    embed = parse_spec(image_spec(f"{tmp_path}/photos/*", {"kind": "embed_image"},
                                  {"provider": "image", "config": {"torch_module": net, "image_size": 32}}))
    assert run_pipeline(embed, tmp_path / "store-embed", [KEY]).success
    rows = output(tmp_path / "store-embed")
    vectors = {n: np.array(r["embedding"]) for n, r in rows.items() if r["embedding"] is not None}
    assert sorted(vectors) == sorted(n for n in made if n not in BAD)
    assert vectors["red-0.png"] @ vectors["red-1.png"] > vectors["red-0.png"] @ vectors["blue-0.jpg"]
    check_bad_rows(rows, f"{tmp_path}/photos", "embedding")


def test_pictures_on_s3_are_embedded_and_sent_as_image_parts(s3_bucket: str, tmp_path: Path, net: str,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket = s3_bucket.removeprefix("s3://")
    made = pictures(tmp_path / "local")
    big = tmp_path / "local" / "wide-red.png"
    Image.new("RGB", (1200, 600), RED).save(big)
    made["wide-red.png"] = big
    for name, path in made.items():
        s3.put_object(Bucket=bucket, Key=f"photos/{name}", Body=path.read_bytes())
    where = f"{s3_bucket}/photos"

    embed = parse_spec(image_spec(f"{where}/*", {"kind": "embed_image"},
                                  {"provider": "image", "config": {"torch_module": net, "image_size": 32}}))
    assert run_pipeline(embed, tmp_path / "store", [KEY]).success
    rows = output(tmp_path / "store")
    assert sorted(rows) == sorted(made)
    assert sorted(n for n, r in rows.items() if r["embedding"] is not None) == sorted(n for n in made if n not in BAD)
    check_bad_rows(rows, where, "embedding")

    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")

    def describe(body: dict[str, Any]) -> dict[str, Any]:
        text, image = body["messages"][-1]["content"]
        data = base64.b64decode(image["image_url"]["url"].split(",", 1)[1])
        sent = Image.open(io.BytesIO(data)).convert("RGB")
        colour = "red" if sent.getpixel((5, 5))[0] > sent.getpixel((5, 5))[2] else "blue"
        return completion(f"{colour} {sent.size[0]}x{sent.size[1]}", body)

    with FaultProxy(lambda key, n: Reply(describe)) as proxy:
        raw = image_spec(f"{where}/*", {"kind": "generate", "params": {"max_new_tokens": 8}},
                         {"provider": "openai", "config": {"model": "gpt-4o-mini", "base_url": proxy.url,
                                                           "send_default_api_key": True}})
        raw["prepare"] = {"image_columns": ["file_path"], "image_max_side": 256, "template": "What colour is it?"}
        assert run_pipeline(parse_spec(raw), tmp_path / "store-prompts", [KEY]).success
        sent = len(proxy.attempts)
    assert sent == len(made) - len(BAD)  # a picture that does not decode is never sent
    rows = {r["row_id"]: r for r in pq.read_table(tmp_path / "store-prompts" / "photos" / "output" / f"{KEY}.parquet")
            .to_pylist()}
    assert sorted(rows) == sorted(made)
    assert rows["wide-red.png"]["generated_text"] == "red 256x128"  # resized in prepare before it was sent
    assert rows["blue-0.jpg"]["generated_text"].startswith("blue ")
    assert rows["red-1.png"]["generated_text"].startswith("red ")
    for name in BAD:
        assert rows[name]["generated_text"] is None and f"{where}/{name}" in rows[name]["error"]
