"""The default preprocessing of custom torch image models (resources/vision/preprocess.py): whatever image a user's
rows hold (a PIL image of any mode, or a numpy array of any common layout and bit depth), the model gets a
(3, size, size) float32 tensor that shows that image: grayscale repeated, alpha dropped, 16-bit and float images at
their own brightness (not saturated white), tiny and huge images resized alike; a non-image is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from batch_assets.resources.vision.preprocess import IMAGENET_MEAN, IMAGENET_STD, default_preprocess, to_rgb_array

SIZE = 32


def unnormalised(tensor: torch.Tensor) -> np.ndarray:
    """The tensor back in [0, 1] per channel (what the image looked like to the model)."""
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    return (tensor * std + mean).numpy()


def grey(level: float, mode: str = "L", size: tuple[int, int] = (8, 6)) -> Image.Image:
    image = Image.new("RGB", size, (round(level * 255),) * 3)
    # an adaptive palette holds the grey exactly (the default web palette would dither it)
    return image.convert("P", palette=Image.Palette.ADAPTIVE) if mode == "P" else image.convert(mode)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "LA", "P", "CMYK", "I", "F", "1"])
def test_every_pil_mode_becomes_three_channels_of_the_same_picture(mode):
    image = grey(0.5 if mode != "1" else 1.0, mode)
    tensor = default_preprocess(image, size=SIZE)
    assert tensor.shape == (3, SIZE, SIZE) and tensor.dtype == torch.float32 and torch.isfinite(tensor).all()
    pixels = unnormalised(tensor)
    expected = 1.0 if mode == "1" else 0.5
    assert np.allclose(pixels, expected, atol=0.03), (mode, pixels.mean(axis=(1, 2)))


def test_a_16_bit_greyscale_png_keeps_its_brightness():
    """A 16-bit scan (medical, scientific, many PNG exporters) at a quarter of full scale is dark grey, not white."""
    level = 16384  # 0.25 of 65535
    array16 = np.full((6, 8), level, dtype=np.uint16)
    for image in (Image.fromarray(array16), array16, array16[:, :, None]):
        pixels = unnormalised(default_preprocess(image, size=SIZE))
        assert np.allclose(pixels, 0.25, atol=0.02), (type(image), pixels.mean())


@pytest.mark.parametrize(("array", "level"), [
    (np.full((5, 7), 0.5, dtype=np.float32), 0.5),  # float in [0, 1]
    (np.full((5, 7, 3), 127.5, dtype=np.float64), 0.5),  # float in [0, 255]
    (np.full((5, 7, 1), 64, dtype=np.uint8), 64 / 255),  # HxWx1, as OpenCV and torchvision hand out greyscale
    (np.full((5, 7, 2), 200, dtype=np.uint8), 200 / 255),  # greyscale + alpha
    (np.full((5, 7, 4), 30, dtype=np.uint8), 30 / 255),  # RGBA
    (np.full((5, 7, 3), 300, dtype=np.int32), 1.0),  # out-of-range ints clip to white
])
def test_numpy_images_of_every_common_layout(array, level):
    pixels = unnormalised(default_preprocess(array, size=SIZE))
    assert np.allclose(pixels, level, atol=0.02), pixels.mean(axis=(1, 2))


def test_rgb_channels_stay_in_order():
    array = np.zeros((4, 4, 3), dtype=np.uint8)
    array[..., 0] = 255  # pure red
    pixels = unnormalised(default_preprocess(array, size=SIZE))
    assert np.allclose(pixels[0], 1.0, atol=0.02) and np.allclose(pixels[1:], 0.0, atol=0.02)
    assert to_rgb_array(Image.fromarray(array)).tolist() == array.tolist()


def test_a_one_pixel_image_and_a_huge_one_are_resized_alike():
    tiny = default_preprocess(grey(0.2, "RGB", (1, 1)), size=SIZE)
    huge = default_preprocess(grey(0.2, "RGB", (4000, 3000)), size=SIZE)
    assert tiny.shape == huge.shape == (3, SIZE, SIZE)
    assert torch.allclose(tiny, huge, atol=0.02)


def test_half_black_half_white_keeps_its_halves_after_a_square_resize():
    array = np.zeros((20, 60), dtype=np.uint8)
    array[:, 30:] = 255  # left black, right white, wide
    pixels = unnormalised(default_preprocess(array, size=SIZE))
    assert pixels[:, :, : SIZE // 2 - 2].max() < 0.05 and pixels[:, :, SIZE // 2 + 2:].min() > 0.95


@pytest.mark.parametrize("bad", [np.zeros((4,)), np.zeros((2, 3, 4, 5)), np.zeros((4, 4, 5))])
def test_what_is_not_an_image_is_refused_with_its_shape(bad):
    with pytest.raises(ValueError, match=rf"expected an image.*shape {re_shape(bad.shape)}"):
        default_preprocess(bad, size=SIZE)


def re_shape(shape: tuple[int, ...]) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")
