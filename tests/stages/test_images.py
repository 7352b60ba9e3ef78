"""Image columns in the prepare stage (stages/images.py): each row's images decoded, resized to image_max_side and
encoded once, in column order; a row whose image cannot be used keeps its place with a problem naming the column
and the reason (never dropped, never a shifted image on the next row)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
from PIL import Image

from batch_assets.spec import parse_spec
from batch_assets.stages.images import prepare_images


def _spec(tmp_path: Path, columns: list[str]):
    return parse_spec({
        "name": "captions",
        "source": {"format": "jsonl", "path": str(tmp_path / "{partition}.jsonl"), "columns": ["id", *columns]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "id", "template": "Describe these images.", "image_columns": columns,
                    "image_max_side": 64},
        "task": {"kind": "generate"},
        "model": {"provider": "openai", "config": {"model": "m"}},
    })


def _png(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> str:
    Image.new("RGB", size, colour).save(path)
    return str(path)


def test_each_row_gets_its_images_in_column_order_resized_and_a_bad_one_is_its_row_s_problem(tmp_path: Path) -> None:
    red = _png(tmp_path / "red.png", (640, 320), (255, 0, 0))
    blue = _png(tmp_path / "blue.png", (20, 40), (0, 0, 255))
    (tmp_path / "broken.png").write_bytes(b"not an image at all")
    batch = pa.RecordBatch.from_pylist([
        {"id": "1", "front": red, "back": blue},
        {"id": "2", "front": str(tmp_path / "missing.png"), "back": blue},
        {"id": "3", "front": blue, "back": None},
        {"id": "4", "front": str(tmp_path / "broken.png"), "back": red},
        {"id": "5", "front": None, "back": str(tmp_path / "missing.png")},
    ])
    images, problems = prepare_images(_spec(tmp_path, ["front", "back"]), batch)
    assert images.type == pa.list_(pa.binary()) and len(images) == 5
    decoded = [[Image.open(io.BytesIO(data)) for data in row] for row in images.to_pylist()]
    assert [[im.size for im in row] for row in decoded] == [[(64, 32), (20, 40)], [(20, 40)], [(20, 40)], [(64, 32)], []]
    assert decoded[0][0].convert("RGB").getpixel((10, 10))[0] > 200  # the red one first, as the columns are listed
    assert decoded[0][1].convert("RGB").getpixel((5, 5))[2] > 200
    assert problems[0] is None
    assert problems[1].startswith("image in column 'front' could not be used") and "missing.png" in problems[1]
    assert problems[2] == "image in column 'back' could not be used: no image (null)"
    assert problems[3].startswith("image in column 'front' could not be used")
    assert problems[4] == "image in column 'front' could not be used: no image (null)"  # the first one named


def test_an_empty_batch_has_no_images(tmp_path: Path) -> None:
    batch = pa.RecordBatch.from_pylist([], pa.schema([("id", pa.string()), ("front", pa.string())]))
    images, problems = prepare_images(_spec(tmp_path, ["front"]), batch)
    assert len(images) == 0 and problems == []
