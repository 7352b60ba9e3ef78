"""Image models: CLIP through sentence-transformers, or any torch module by import path."""

from batch_assets.resources.vision.provider import ImageModelProvider

__all__ = ["ImageModelProvider"]
