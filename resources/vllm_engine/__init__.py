"""vLLM backend: the offline `vllm.LLM` engine on the GPUs of the step's process or pod.

vLLM is imported only when the engine loads; without it `load()` raises `MissingExtraError` telling you to
`pip install 'batch-assets[vllm]'` (CUDA nodes only). See docs/providers-vllm.md.
"""

from batch_assets.resources.vllm_engine.provider import VLLMEngineProvider

__all__ = ["VLLMEngineProvider"]
