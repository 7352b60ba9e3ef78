"""embed_image / classify_image (batch_assets/tasks/image.py): each row's image is read and decoded before the
provider call; an image that cannot be read is that row's error, naming the file, and the rest of the chunk goes
on; odd images reach the model as the picture a person sees (EXIF rotation applied, CMYK and palette images in RGB,
transparency on white, huge ones shrunk to prepare.image_max_side)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from batch_assets.tasks.image import ClassifyImageTask, EmbedImageTask
from tests.tasks.prepared import prepared, spec_for


def task(max_side: int | None = None) -> EmbedImageTask:
    prepare = {"image_columns": ["image"], **({"image_max_side": max_side} if max_side else {})}
    return EmbedImageTask(spec_for({"kind": "embed_image"}, prepare, ["image"]), provider=None)


def save(path: Path, image: Image.Image, fmt: str, **kwargs) -> str:
    image.save(path, fmt, **kwargs)
    return str(path)


def test_unreadable_images_are_their_rows_errors_naming_the_file_and_the_rest_are_sent(tmp_path: Path):
    good = save(tmp_path / "good.png", Image.new("RGB", (10, 10), "red"), "PNG")
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff this is not a jpeg")
    refs = [good, str(tmp_path / "missing.png"), str(corrupt), None, good]
    flags = [None, None, None, "empty input: column 'image' is empty", None]
    plan = task().plan(prepared({"image": refs}, flags))
    assert plan.sent.tolist() == [0, 4] and len(plan.inputs) == 2
    assert all(img.mode == "RGB" and img.size == (10, 10) for img in plan.inputs)
    assert plan.errors[0] is None and plan.errors[4] is None and plan.errors[3] == flags[3]
    assert plan.errors[1].startswith("image could not be read") and "missing.png" in plan.errors[1]
    assert plan.errors[2].startswith("image could not be read") and "corrupt.jpg" in plan.errors[2]


def test_a_chunk_whose_every_image_is_unreadable_is_sent_nothing_and_written_with_typed_nulls(tmp_path: Path):
    t = ClassifyImageTask(spec_for({"kind": "classify_image", "labels": ["cat", "dog"]}, {"image_columns": ["image"]},
                                   ["image"]), provider=None)
    plan = t.plan(prepared({"image": [str(tmp_path / "a.png"), str(tmp_path / "b.png")]}))
    assert len(plan.sent) == 0 and all(e and "could not be read" in e for e in plan.errors)
    names, arrays = t.columns(plan, None, 2)
    assert names == ["label", "score"] and all(a.null_count == 2 for a in arrays)


def test_a_photo_taken_sideways_reaches_the_model_upright(tmp_path: Path):
    """A camera stores a portrait photo as landscape pixels plus EXIF Orientation=6 (rotate 90° clockwise)."""
    pixels = Image.new("RGB", (40, 20), "white")
    pixels.paste((255, 0, 0), (0, 0, 20, 20))  # left half red, as stored
    exif = Image.Exif()
    exif[0x0112] = 6
    ref = save(tmp_path / "portrait.jpg", pixels, "JPEG", exif=exif.tobytes(), quality=95)
    [image] = task().plan(prepared({"image": [ref]})).inputs
    assert image.size == (20, 40)  # upright: portrait
    top, bottom = image.getpixel((10, 5)), image.getpixel((10, 35))
    assert top[0] > 200 and top[1] < 60  # the stored left half is on top after the rotation
    assert min(bottom) > 200


def test_cmyk_palette_and_transparent_images_arrive_as_rgb_the_way_they_look(tmp_path: Path):
    cmyk = save(tmp_path / "print.jpg", Image.new("RGB", (8, 8), (0, 0, 255)).convert("CMYK"), "JPEG", quality=95)
    palette = save(tmp_path / "icon.gif", Image.new("RGB", (8, 8), (0, 255, 0)).convert("P"), "GIF")
    clear = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # fully transparent black: looks like the page (white)
    transparent = save(tmp_path / "logo.png", clear, "PNG")
    images = task().plan(prepared({"image": [cmyk, palette, transparent]})).inputs
    assert [img.mode for img in images] == ["RGB", "RGB", "RGB"]
    blue, green, white = (img.getpixel((4, 4)) for img in images)
    assert blue[2] > 200 and max(blue[:2]) < 60
    assert green[1] > 200 and max(green[0], green[2]) < 60
    assert min(white) > 250


def test_a_huge_image_is_shrunk_to_the_configured_side_keeping_its_shape(tmp_path: Path):
    buf = io.BytesIO()
    Image.new("RGB", (3000, 1500), "blue").save(buf, "PNG")
    (tmp_path / "big.png").write_bytes(buf.getvalue())
    [image] = task(max_side=300).plan(prepared({"image": [str(tmp_path / "big.png")]})).inputs
    assert image.size == (300, 150)


def test_an_image_task_needs_exactly_one_image_column():
    with pytest.raises(Exception, match="exactly one image column"):
        spec_for({"kind": "embed_image"}, {"image_columns": ["a", "b"]}, ["a", "b"])
