"""Model providers: Dagster resources behind small capability protocols (embed / generate / classify)."""

# First, before any library that reports usage or leaves a child behind is imported (resources/telemetry.py,
# resources/process_exit.py).
import batch_assets.resources.process_exit  # noqa: F401, I001
import batch_assets.resources.telemetry  # noqa: F401

from batch_assets.resources.base import LOAD_COUNTS, ModelResource, resolve_device
from batch_assets.resources.protocols import (
    Classification,
    Generation,
    GenerationParams,
    TextClassifier,
    TextEmbedder,
    TextGenerator,
)
from batch_assets.resources.registry import PROVIDERS, provider_class

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
