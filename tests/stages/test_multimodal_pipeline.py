"""Image columns in a generate pipeline: decoded and resized in prepare, sent as image content parts in infer."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pyarrow as pa
from PIL import Image
from pydantic import PrivateAttr

from batch_assets.spec import parse_spec
from batch_assets.stages.infer import InferStats, run_infer
from batch_assets.stages.prepare import prepare_batches
from batch_assets.storage import ArrowStorage, read_batches, write_parquet
from batch_assets.resources.base import ModelResource
from batch_assets.resources.protocols import Generation

class RecordingGenerator(ModelResource):
    """Stand-in at the narrowest seam: records the conversations the infer stage builds."""

    _conversations: list = PrivateAttr(default_factory=list)

    @property
    def conversations(self) -> list:
        return self._conversations

    def model_name(self) -> str:
        return "recorder"

    def generate(self, conversations, params):
        self.conversations.extend(conversations)
        return [Generation(text="a red square", prompt_tokens=10, completion_tokens=3) for _ in conversations]


def test_images_prepared_once_and_sent_as_content_parts(tmp_path: Path) -> None:
    big = tmp_path / "red.png"
    Image.new("RGB", (1200, 600), (255, 0, 0)).save(big)
    spec = parse_spec({
        "name": "captions",
        "source": {"format": "jsonl", "path": str(tmp_path / "{partition}.jsonl"), "columns": ["id", "image", "hint"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "id", "template": "Describe this image ({hint}).", "image_columns": ["image"],
                    "image_max_side": 256},
        "task": {"kind": "generate"},
        "model": {"provider": "openai", "config": {"model": "m"}},
    })
    raw = pa.record_batch({
        "id": ["1", "2"], "image": [str(big), str(tmp_path / "missing.png")], "hint": ["colour", "shape"],
        "row_id": ["1", "2"], "_source_file": ["x.jsonl"] * 2, "_source_row": [1, 2],
    })
    prepared = list(prepare_batches(spec, iter([raw])))
    assert prepared[0].column("_images").to_pylist()[1] == []
    assert "could not be used" in prepared[0].column("_input_problem").to_pylist()[1]

    recorder = RecordingGenerator()  # through the infer stage's loop, on local storage
    storage = ArrowStorage(root=str(tmp_path / "store"))
    with write_parquet(storage.stage_url(spec.name, "prepared", "a"), prepared[0].schema) as writer:
        writer.write(prepared[0])
    report = run_infer(spec, storage, "a", recorder, InferStats())
    out = [row for batch in read_batches(report.path) for row in batch.to_pylist()]

    assert len(recorder.conversations) == 1  # the row whose image failed is not sent
    content = recorder.conversations[0][-1]["content"]
    assert content[0] == {"type": "text", "text": "Describe this image (colour)."}
    url = content[1]["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert max(sent.size) == 256  # resized in preparation
    assert out[0]["generated_text"] == "a red square" and out[0]["error"] is None
    assert out[1]["generated_text"] is None and "missing.png" in out[1]["error"]
