"""Default preprocessing for custom torch image models: RGB, square resize, scale to [0, 1], normalise.

Works on PIL images and on HxW / HxWxC uint8 numpy arrays without importing Pillow itself; torchvision is not
needed. A model trained with other preprocessing (center crop, different statistics) should pass its own function
through `ImageModelProvider.preprocess`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# PIL modes of one wide channel: read as numbers and scaled by their depth below. Pillow's own convert("RGB") clips
# them at 255, which turns a 16-bit scan (medical, scientific, many PNG exporters) into a white square.
_WIDE_GREY_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


def to_rgb_array(image: Any) -> np.ndarray:
    """HxWx3 uint8 from a PIL image or a numpy array: greyscale (HxW, HxWx1, HxWx2 with alpha) is repeated, alpha
    is dropped, 16-bit values are scaled to 8 bits, floats in [0, 1] to [0, 255]; other values clip to [0, 255]."""
    if hasattr(image, "convert") and hasattr(image, "mode"):  # PIL.Image
        image = np.asarray(image) if image.mode in _WIDE_GREY_MODES else image.convert("RGB")
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[2] in (1, 2):  # greyscale with a channel axis (and alpha): OpenCV, torch
        array = array[:, :, 0]
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (3, 4):
        raise ValueError(f"expected an image (HxW, HxWx1/2 or HxWx3/4), got an array of shape {array.shape}")
    array = array[:, :, :3]
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.max(initial=0.0) <= 1.0:
            array = array * 255.0
        elif array.dtype == np.uint16:  # 16 bits per channel: 65535 is white
            array = array / 257.0
        array = np.clip(array, 0, 255).astype(np.uint8)
    return array


def default_preprocess(
    image: Any,
    size: int = 224,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> Any:
    """One image -> float32 tensor of shape (3, size, size)."""
    import torch
    import torch.nn.functional as F

    array = to_rgb_array(image)
    if not (array.flags.writeable and array.flags.c_contiguous):  # arrays viewing a PIL image are read-only
        array = np.array(array)
    tensor = torch.from_numpy(array).permute(2, 0, 1).float().div_(255.0)
    tensor = F.interpolate(tensor[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    mean_t = torch.tensor(list(mean), dtype=tensor.dtype)[:, None, None]
    std_t = torch.tensor(list(std), dtype=tensor.dtype)[:, None, None]
    return (tensor - mean_t) / std_t
