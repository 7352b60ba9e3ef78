"""OpenAI-compatible HTTP endpoints (OpenAI, vLLM, llama.cpp's server) as a generation and embedding provider.

The `openai` package is imported when the provider loads, not when this package is imported.
"""

from batch_assets.resources.openai_api.provider import EmbeddingError, OpenAICompatibleProvider
from batch_assets.resources.openai_api.payloads import UnsupportedConstraintError

__all__ = ["EmbeddingError", "OpenAICompatibleProvider", "UnsupportedConstraintError"]
