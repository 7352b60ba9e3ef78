"""Model providers: Dagster resources behind small capability protocols (embed / generate / classify)."""

from resources.base import LOAD_COUNTS, ModelResource, resolve_device
from resources.protocols import (
    Classification,
    Generation,
    GenerationParams,
    TextClassifier,
    TextEmbedder,
    TextGenerator,
)
from resources.registry import PROVIDERS, provider_class

__all__ = [
    "LOAD_COUNTS",
    "PROVIDERS",
    "Classification",
    "Generation",
    "GenerationParams",
    "ModelResource",
    "TextClassifier",
    "TextEmbedder",
    "TextGenerator",
    "provider_class",
    "resolve_device",
]
