"""`embed_image` and `classify_image` as pipelines: image files named in a source column, decoded in prepare, through
the `image` provider (a small user torch module by import path, labels from example images), published one row per
source row with a readable error where an image cannot be read."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from batch_assets.spec import parse_spec
from tests.conftest import run_pipeline, write_jsonl

NET = textwrap.dedent('''
    import torch
    from torch import nn


    def build(dim=8):
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 6, kernel_size=3, stride=2), nn.Tanh(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(6, dim))
''')
RED, BLUE = (220, 20, 20), (20, 40, 220)


@pytest.fixture
def net(tmp_path: Path) -> Iterator[str]:
    """The user's model code, importable as the provider's `torch_module`."""
    name = f"user_net_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(NET)
    sys.path.insert(0, str(tmp_path))
    yield f"{name}:build"
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)


def picture(path: Path, colour: tuple[int, int, int], seed: int) -> str:
    rng = np.random.default_rng(seed)
    array = np.clip(np.array(colour, dtype=np.int16) + rng.integers(-12, 13, size=(40, 48, 3)), 0, 255)
    Image.fromarray(array.astype(np.uint8)).save(path)
    return str(path)


def _spec(tmp_path: Path, task: dict, model: dict) -> dict:
    return {
        "name": "pictures",
        "source": {"format": "jsonl", "path": f"{tmp_path}/data/{{partition}}.jsonl", "columns": ["pic_id", "image"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "pic_id", "image_columns": ["image"], "image_max_side": 64},
        "task": task,
        "model": {"provider": "image", "config": model},
        "runtime": {"max_error_fraction": 0.25},
    }


def _rows(tmp_path: Path) -> list[dict]:
    folder = tmp_path / "pictures"
    folder.mkdir()
    rows = [{"pic_id": f"r{i}", "image": picture(folder / f"r{i}.png", RED, 10 + i)} for i in range(3)]
    rows += [{"pic_id": f"b{i}", "image": picture(folder / f"b{i}.png", BLUE, 20 + i)} for i in range(3)]
    rows.append({"pic_id": "gone", "image": str(folder / "gone.png")})
    write_jsonl(tmp_path / "data" / "a.jsonl", rows)
    return rows


def test_classify_image_pipeline_labels_each_picture(tmp_path: Path, net: str) -> None:
    rows = _rows(tmp_path)
    examples = {"red": [picture(tmp_path / f"ex-red{s}.png", RED, s) for s in range(2)],
                "blue": [picture(tmp_path / f"ex-blue{s}.png", BLUE, s) for s in range(2)]}
    spec = parse_spec(_spec(tmp_path, {"kind": "classify_image", "labels": ["red", "blue"]},
                            {"torch_module": net, "image_size": 32, "label_examples": examples}))
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    out = pq.read_table(tmp_path / "store" / "pictures" / "output" / "a.parquet").to_pylist()
    assert [r["pic_id"] for r in out] == [r["pic_id"] for r in rows]  # every row once, in source order
    by_id = {r["pic_id"]: r for r in out}
    assert [by_id[f"r{i}"]["label"] for i in range(3)] == ["red"] * 3
    assert [by_id[f"b{i}"]["label"] for i in range(3)] == ["blue"] * 3
    assert by_id["gone"]["label"] is None and "gone.png" in by_id["gone"]["error"]


def test_embed_image_pipeline_writes_one_unit_vector_per_picture(tmp_path: Path, net: str) -> None:
    rows = _rows(tmp_path)
    spec = parse_spec(_spec(tmp_path, {"kind": "embed_image"}, {"torch_module": net, "image_size": 32}))
    assert run_pipeline(spec, tmp_path / "store", ["a"]).success
    out = pq.read_table(tmp_path / "store" / "pictures" / "output" / "a.parquet").to_pylist()
    assert [r["pic_id"] for r in out] == [r["pic_id"] for r in rows]
    vectors = {r["pic_id"]: np.array(r["embedding"]) for r in out if r["embedding"] is not None}
    assert sorted(vectors) == sorted(r["pic_id"] for r in rows if r["pic_id"] != "gone")
    assert all(v.shape == (8,) and abs(np.linalg.norm(v) - 1.0) < 1e-4 for v in vectors.values())
    # each row holds its own picture's vector: the same model, called on that file alone, agrees
    from batch_assets.resources.vision import ImageModelProvider

    model = ImageModelProvider(torch_module=net, image_size=32).load_for_tests()
    for row in rows[:-1]:
        alone = model.embed_images([Image.open(row["image"]).convert("RGB")])[0]
        assert np.allclose(vectors[row["pic_id"]], alone, atol=1e-4), row["pic_id"]
    assert vectors["r0"] @ vectors["r1"] > vectors["r0"] @ vectors["b0"]  # one colour nearer than the other
    gone = next(r for r in out if r["pic_id"] == "gone")
    assert gone["embedding"] is None and "gone.png" in gone["error"]
