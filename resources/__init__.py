"""Model providers: Dagster resources behind small capability protocols (embed / generate / classify)."""

# First, before any library that reports usage or leaves a child behind is imported (resources/telemetry.py,
# resources/process_exit.py).
import resources.process_exit  # noqa: F401, I001
import resources.telemetry  # noqa: F401

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
