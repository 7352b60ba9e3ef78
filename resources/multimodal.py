"""Images for image models and multimodal prompts, prepared once before any request is sent.

The prepare stage turns each image reference (raw bytes, a local path, `file://`, `s3://`, `http(s)://` or a
`data:` URL) into compact JPEG/PNG bytes, resized so its longest side fits `max_side`: `prepare_images`. The request
loop only base64-wraps those bytes into OpenAI chat content parts (`build_user_content`), so decoding and
resizing never run while a model or endpoint waits.

S3 goes through s3fs; its endpoint comes from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and its credentials from the
usual AWS variables, as for the rest of the storage layer. http and https share one code path (urllib).
"""

from __future__ import annotations

import base64
import io
import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_assets.resources.provider_errors import MissingExtraError

DEFAULT_MAX_SIDE = 768
MAX_DOWNLOAD_BYTES = 50 * 1024 * 1024  # a bigger "image" is almost certainly the wrong object
ImageRef = bytes | bytearray | memoryview | str | os.PathLike

_MIME_BY_FORMAT = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}


class ImageLoadError(ValueError):
    """An image reference could not be read or decoded; the message names the reference."""


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(
            "image inputs need the 'Pillow' package, which is not installed in this environment: pip install pillow"
        ) from exc
    return Image


def describe_ref(ref: Any) -> str:
    """A short, log-safe name for a reference (never a whole data: URL or byte string)."""
    if isinstance(ref, (bytes, bytearray, memoryview)):
        head = bytes(ref[:8])
        return f"<{len(ref)} bytes starting {head!r}>"
    text = os.fspath(ref) if isinstance(ref, os.PathLike) else str(ref)
    if text.startswith("data:"):
        return text[: text.find(",") + 1 if "," in text else 40] + "...>"
    return text if len(text) <= 300 else text[:300] + "..."


# -- reading ---------------------------------------------------------------------------------------------------------
def read_image_bytes(
    ref: ImageRef, *, storage_options: dict[str, Any] | None = None, timeout: float = 30.0, s3: Any = None
) -> bytes:
    """The raw bytes behind a reference. Raises FileNotFoundError / ImageLoadError naming the reference.

    `s3` is an s3fs filesystem to reuse across many reads (prepare_images makes one per call); without it one is
    made from `storage_options` and the environment.
    """
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return bytes(ref)
    if not isinstance(ref, (str, os.PathLike)):
        raise ImageLoadError(
            f"unsupported image reference of type {type(ref).__name__}: give bytes, a local path, or an s3://, "
            "http(s)://, file:// or data: URL"
        )
    text = os.fspath(ref)
    if text.startswith("s3://"):
        return _read_s3(text, s3 if s3 is not None else s3_filesystem(storage_options))
    if text.startswith(("http://", "https://")):
        return _read_http(text, timeout)
    if text.startswith("data:"):
        return _read_data_url(text)
    path = Path(text.removeprefix("file://")).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"image {text!r} not found (no such file: {path})")
    return path.read_bytes()


def s3_filesystem(storage_options: dict[str, Any] | None = None) -> Any:
    """An s3fs filesystem configured as the storage layer's (batch_assets.storage.s3_options_from_env): endpoint
    from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, region from AWS_REGION / AWS_DEFAULT_REGION, credentials from
    boto's usual chain, all read now rather than from a cached instance. `storage_options` override them."""
    try:
        import s3fs
    except ImportError as exc:
        raise MissingExtraError("s3fs", "s3", "reading s3:// images") from exc
    options = dict(storage_options or {})
    client_kwargs = dict(options.get("client_kwargs") or {})
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if endpoint:
        client_kwargs.setdefault("endpoint_url", endpoint)
    if region:
        client_kwargs.setdefault("region_name", region)
    options["client_kwargs"] = client_kwargs
    options.setdefault("skip_instance_cache", True)
    return s3fs.S3FileSystem(**options)


def _read_s3(url: str, fs: Any) -> bytes:
    try:
        data = fs.cat_file(url, start=0, end=MAX_DOWNLOAD_BYTES + 1)  # one ranged GET, bounded
    except FileNotFoundError:
        raise FileNotFoundError(f"image {url!r} not found in S3") from None
    except PermissionError as exc:
        raise ImageLoadError(f"image {url!r}: access denied ({exc}); check the AWS credentials") from None
    except OSError as exc:
        if "not satisfiable" not in str(exc):
            raise ImageLoadError(f"image {url!r} could not be read from S3 ({exc})") from None
        data = b""  # a zero-byte object: S3 refuses any byte range of it (416), and it holds no image either
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise ImageLoadError(f"image {url!r} is over the {MAX_DOWNLOAD_BYTES}-byte limit")
    return data


def _read_http(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "batch-assets-image-loader"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(MAX_DOWNLOAD_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise ImageLoadError(f"image {url!r}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ImageLoadError(f"image {url!r} could not be fetched: {exc}") from None
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise ImageLoadError(f"image {url!r} is over the {MAX_DOWNLOAD_BYTES}-byte limit")
    return data


def _read_data_url(url: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header:
        raise ImageLoadError(f"image {describe_ref(url)}: only base64 data: URLs are supported")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError as exc:
        raise ImageLoadError(f"image {describe_ref(url)}: invalid base64 ({exc})") from None


# -- decoding and resizing --------------------------------------------------------------------------------------------
def load_image(
    ref: Any,
    max_side: int | None = DEFAULT_MAX_SIDE,
    *,
    mode: str = "RGB",
    storage_options: dict[str, Any] | None = None,
    timeout: float = 30.0,
    s3: Any = None,
) -> Any:
    """Read, decode, orient (EXIF) and shrink an image so its longest side is at most `max_side` (never enlarged).

    Returns a PIL image in `mode` ("RGB" by default; transparency is flattened onto white). A PIL image passed in
    is only resized and converted.
    """
    Image = _pil()
    from PIL import ImageOps

    if isinstance(ref, Image.Image):
        img = ref
    else:
        data = read_image_bytes(ref, storage_options=storage_options, timeout=timeout, s3=s3)
        try:
            img = Image.open(io.BytesIO(data))
            if max_side and img.format == "JPEG":
                img.draft("RGB", (max_side, max_side))  # let the JPEG decoder downscale by 1/2..1/8 for free
            img.load()
        except (Image.UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError) as exc:
            raise ImageLoadError(
                f"image {describe_ref(ref)} is not an image Pillow can decode ({type(exc).__name__}: {exc}); "
                "give a JPEG, PNG, WebP, GIF or BMP file"
            ) from None
        img = ImageOps.exif_transpose(img)
    return _to_mode(resize_to_fit(img, max_side), mode)


def resize_to_fit(img: Any, max_side: int | None) -> Any:
    """Shrink so that max(width, height) <= max_side, keeping the aspect ratio; smaller images are unchanged."""
    if not max_side or max(img.size) <= max_side:
        return img
    Image = _pil()
    scale = max_side / max(img.size)
    size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
    return img.resize(size, Image.Resampling.LANCZOS)


def _to_mode(img: Any, mode: str) -> Any:
    if img.mode == mode:
        return img
    if mode == "RGB" and (img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)):
        Image = _pil()
        rgba = img.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return img.convert(mode)


def encode_image(img: Any, format: str = "JPEG", *, quality: int = 90) -> bytes:
    """Compress a PIL image to JPEG (default; alpha is flattened) or PNG / WebP bytes."""
    fmt = format.upper().replace("JPG", "JPEG")
    if fmt not in _MIME_BY_FORMAT:
        raise ValueError(f"image format {format!r} is not supported: use JPEG, PNG or WEBP")
    if fmt == "JPEG":
        img = _to_mode(img, "RGB") if img.mode not in ("RGB", "L") else img
    buffer = io.BytesIO()
    options: dict[str, Any] = {"quality": quality} if fmt in ("JPEG", "WEBP") else {"optimize": True}
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def mime_type(image_bytes: bytes) -> str:
    """The MIME type of encoded image bytes, from their magic number."""
    head = bytes(image_bytes[:12])
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    raise ImageLoadError(
        f"{describe_ref(image_bytes)} is not JPEG, PNG, GIF or WebP data: prepare images with prepare_images() "
        "before building prompts"
    )


# -- the prepare stage ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedImage:
    """One row's image after the prepare stage: encoded bytes, or the reason it failed."""

    data: bytes | None
    mime: str | None
    width: int | None = None
    height: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def prepare_image(
    ref: Any,
    max_side: int | None = DEFAULT_MAX_SIDE,
    format: str = "JPEG",
    *,
    storage_options: dict[str, Any] | None = None,
    timeout: float = 30.0,
    s3: Any = None,
) -> PreparedImage:
    """Load + resize + encode one image. Raises on a bad reference (prepare_images turns that into a row error)."""
    img = load_image(ref, max_side, storage_options=storage_options, timeout=timeout, s3=s3)
    data = encode_image(img, format)
    return PreparedImage(data=data, mime=mime_type(data), width=img.width, height=img.height)


def prepare_images(
    refs: Iterable[Any],
    max_side: int | None = DEFAULT_MAX_SIDE,
    format: str = "JPEG",
    *,
    storage_options: dict[str, Any] | None = None,
    timeout: float = 30.0,
    max_workers: int = 8,
) -> list[PreparedImage]:
    """Prepare a column of references, in order, fetching in parallel (network-bound for s3/http).

    A reference that cannot be read or decoded yields a PreparedImage with `error` set instead of failing the whole
    chunk; None stays a row error too. Missing Pillow or s3fs still raises: that is a broken environment, not a row.
    """
    refs = list(refs)
    needs_s3 = any(isinstance(ref, str) and ref.startswith("s3://") for ref in refs)
    s3 = s3_filesystem(storage_options) if needs_s3 else None  # one client for the whole column

    def one(ref: Any) -> PreparedImage:
        if ref is None:
            return PreparedImage(data=None, mime=None, error="no image (null)")
        try:
            return prepare_image(ref, max_side, format, storage_options=storage_options, timeout=timeout, s3=s3)
        except (ImageLoadError, FileNotFoundError) as exc:
            return PreparedImage(data=None, mime=None, error=str(exc))

    if len(refs) <= 1 or max_workers <= 1:
        return [one(ref) for ref in refs]
    with ThreadPoolExecutor(max_workers=min(max_workers, len(refs))) as pool:
        return list(pool.map(one, refs))


# -- building prompts (request loop: no decoding here) ---------------------------------------------------------------
def data_url(image_bytes: bytes, mime: str | None = None) -> str:
    """`data:image/...;base64,...` for encoded image bytes."""
    return f"data:{mime or mime_type(image_bytes)};base64,{base64.b64encode(image_bytes).decode('ascii')}"


def image_content_part(image_bytes: bytes, mime: str | None = None, *, detail: str | None = None) -> dict[str, Any]:
    """An OpenAI chat content part: {"type": "image_url", "image_url": {"url": "data:..."}}."""
    image_url: dict[str, Any] = {"url": data_url(image_bytes, mime)}
    if detail is not None:
        image_url["detail"] = detail
    return {"type": "image_url", "image_url": image_url}


def file_content_part(filename: str, data: bytes, mime: str = "application/pdf") -> dict[str, Any]:
    """An OpenAI chat content part carrying a document: {"type": "file", "file": {"filename", "file_data"}}."""
    return {"type": "file",
            "file": {"filename": filename, "file_data": f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"}}


def build_user_content(
    text: str | None, images: Sequence[bytes | PreparedImage | str], *, detail: str | None = None,
    files: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The `content` list of one user message: the text part, then one image part per image, then one file part
    per document (`files`: {"filename": ..., "data": bytes}).

    Images must already be prepared: encoded bytes, PreparedImage, or a data:/http(s) URL to pass through as is
    (the endpoint then fetches it). A path or s3:// URL here is an error: decode it in the prepare stage.
    """
    parts: list[dict[str, Any]] = []
    if text:
        parts.append({"type": "text", "text": text})
    for position, image in enumerate(images):
        if isinstance(image, PreparedImage):
            if not image.ok or image.data is None:
                raise ImageLoadError(f"image {position} of this row failed in the prepare stage: {image.error}")
            parts.append(image_content_part(image.data, image.mime, detail=detail))
        elif isinstance(image, (bytes, bytearray, memoryview)):
            parts.append(image_content_part(bytes(image), detail=detail))
        elif isinstance(image, str) and image.startswith(("data:image/", "http://", "https://")):
            url: dict[str, Any] = {"url": image}
            if detail is not None:
                url["detail"] = detail
            parts.append({"type": "image_url", "image_url": url})
        else:
            raise ImageLoadError(
                f"image {position} ({describe_ref(image)}) is not prepared: run prepare_images() on the image column "
                "in the prepare stage and pass the resulting bytes"
            )
    for document in files:
        parts.append(file_content_part(document["filename"], document["data"]))
    return parts
