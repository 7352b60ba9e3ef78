"""Image references (bytes, path, s3://, http://) decoded and resized in the prepare stage, then turned into OpenAI
chat content parts. S3 is a real moto server on loopback; http is a real HTTP server on loopback (https goes
through the same urllib code path but needs TLS, so it is not exercised here)."""

from __future__ import annotations

import base64
import functools
import http.server
import io
import threading

import pytest
from PIL import Image

from batch_assets.resources.multimodal import (
    ImageLoadError,
    PreparedImage,
    build_user_content,
    data_url,
    encode_image,
    image_content_part,
    load_image,
    mime_type,
    prepare_images,
)


def png_bytes(size=(64, 32), color=(200, 30, 30), mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_bytes_decode_to_an_rgb_image():
    img = load_image(png_bytes((64, 32)))
    assert img.size == (64, 32) and img.mode == "RGB"
    assert img.getpixel((0, 0)) == (200, 30, 30)


def test_local_path_and_file_url(tmp_path):
    path = tmp_path / "cat.png"
    path.write_bytes(png_bytes((40, 20)))
    assert load_image(str(path)).size == (40, 20)
    assert load_image(path).size == (40, 20)
    assert load_image(f"file://{path}").size == (40, 20)


def test_resizing_keeps_the_aspect_ratio_and_never_enlarges():
    assert load_image(png_bytes((2000, 1000)), max_side=512).size == (512, 256)
    assert load_image(png_bytes((300, 900)), max_side=90).size == (30, 90)
    assert load_image(png_bytes((50, 40)), max_side=512).size == (50, 40)
    assert load_image(png_bytes((2000, 1000)), max_side=None).size == (2000, 1000)


def test_large_jpeg_is_resized_with_the_decoder_draft():
    big = encode_image(Image.new("RGB", (3000, 1500), (10, 120, 200)), "JPEG")
    assert load_image(big, max_side=500).size == (500, 250)


def test_transparency_is_flattened_onto_white_for_jpeg():
    rgba = load_image(png_bytes((8, 8), (0, 0, 0, 0), mode="RGBA"))
    assert rgba.getpixel((0, 0)) == (255, 255, 255)
    jpeg = encode_image(Image.new("RGBA", (8, 8), (0, 0, 0, 0)), "JPEG")
    assert mime_type(jpeg) == "image/jpeg"


def test_a_non_image_file_names_the_reference(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("these are not pixels")
    with pytest.raises(ImageLoadError, match=rf"image {notes} is not an image Pillow can decode"):
        load_image(str(notes))
    with pytest.raises(ImageLoadError, match=r"<9 bytes starting b'not an i'> is not an image"):
        load_image(b"not an im")


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.png"):
        load_image(str(tmp_path / "missing.png"))


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_s3_url_through_s3fs_against_a_moto_server(moto_endpoint, monkeypatch):
    import boto3

    for name, value in {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    s3.create_bucket(Bucket="images")
    s3.put_object(Bucket="images", Key="raw/photo.png", Body=png_bytes((1200, 600)))
    s3.put_object(Bucket="images", Key="raw/readme.txt", Body=b"hello")

    img = load_image("s3://images/raw/photo.png", max_side=300)
    assert img.size == (300, 150)
    with pytest.raises(FileNotFoundError, match="s3://images/raw/nope.png"):
        load_image("s3://images/raw/nope.png")
    with pytest.raises(ImageLoadError, match="s3://images/raw/readme.txt is not an image"):
        load_image("s3://images/raw/readme.txt")
    prepared = prepare_images(["s3://images/raw/photo.png", "s3://images/raw/nope.png"], max_side=100)
    assert [(p.width, p.height) for p in prepared] == [(100, 50), (None, None)]
    assert "not found in S3" in prepared[1].error


@pytest.fixture(scope="module")
def http_root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("www")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_url_on_loopback(http_root):
    folder, base = http_root
    (folder / "dog.png").write_bytes(png_bytes((100, 400)))
    assert load_image(f"{base}/dog.png", max_side=100).size == (25, 100)
    with pytest.raises(ImageLoadError, match=rf"image '{base}/gone.png': HTTP 404"):
        load_image(f"{base}/gone.png")


def test_prepare_images_keeps_order_and_turns_bad_rows_into_errors(tmp_path, http_root):
    folder, base = http_root
    (folder / "a.png").write_bytes(png_bytes((800, 400)))
    local = tmp_path / "b.png"
    local.write_bytes(png_bytes((10, 10)))
    prepared = prepare_images(
        [f"{base}/a.png", str(local), b"garbage", None, png_bytes((30, 60))], max_side=200, format="JPEG"
    )
    assert [p.ok for p in prepared] == [True, True, False, False, True]
    assert (prepared[0].width, prepared[0].height) == (200, 100)
    assert (prepared[1].width, prepared[1].height) == (10, 10)
    assert prepared[4].mime == "image/jpeg" and mime_type(prepared[4].data) == "image/jpeg"
    assert "not an image" in prepared[2].error


def test_content_parts_carry_a_data_url_that_decodes_to_the_same_bytes():
    data = encode_image(load_image(png_bytes()), "PNG")
    part = image_content_part(data)
    assert part["type"] == "image_url"
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == data
    assert data_url(data, "image/png") == url
    assert image_content_part(data, detail="low")["image_url"]["detail"] == "low"


def test_build_user_content_puts_text_first_then_each_image():
    jpeg = encode_image(load_image(png_bytes()), "JPEG")
    prepared = PreparedImage(data=jpeg, mime="image/jpeg", width=64, height=32)
    content = build_user_content("What is in these pictures?", [prepared, jpeg, "https://example.com/x.jpg"])
    assert content[0] == {"type": "text", "text": "What is in these pictures?"}
    assert [p["type"] for p in content] == ["text", "image_url", "image_url", "image_url"]
    assert content[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert content[3]["image_url"]["url"] == "https://example.com/x.jpg"


def test_build_user_content_refuses_undecoded_references():
    with pytest.raises(ImageLoadError, match="is not prepared: run prepare_images"):
        build_user_content("caption", ["/data/cat.png"])
    failed = PreparedImage(data=None, mime=None, error="image 'x' not found")
    with pytest.raises(ImageLoadError, match="failed in the prepare stage: image 'x' not found"):
        build_user_content("caption", [failed])
