"""Provider names used in pipeline specs (`model.provider`), mapped to their resource classes.

Entries are import strings so that listing providers never imports torch, openai or vllm.
"""

from __future__ import annotations

import importlib

PROVIDERS: dict[str, str] = {
    "sentence_transformers": "batch_assets.resources.hf.embedder:SentenceTransformerEmbedder",
    "transformers": "batch_assets.resources.hf.generator:TransformersGenerator",
    "vllm": "batch_assets.resources.vllm_engine.provider:VLLMEngineProvider",
    "openai": "batch_assets.resources.openai_api.provider:OpenAICompatibleProvider",
    "custom": "batch_assets.resources.custom.provider:CustomModelProvider",
    "zero_shot": "batch_assets.resources.custom.zero_shot:ZeroShotEmbeddingClassifier",
    "hf_pipeline": "batch_assets.resources.custom.hf_pipeline:HFPipelineProvider",
    "image": "batch_assets.resources.vision.provider:ImageModelProvider",
    "faster_whisper": "batch_assets.resources.whisper.provider:FasterWhisperTranscriber",
    "anthropic": "batch_assets.resources.anthropic_api.provider:AnthropicProvider",
}


def provider_class(name: str) -> type:
    try:
        target = PROVIDERS[name]
    except KeyError:
        raise KeyError(f"unknown model provider {name!r}; known providers: {', '.join(sorted(PROVIDERS))}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
