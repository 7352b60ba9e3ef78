"""The real vLLM engine on a GPU, through VLLMEngineProvider. Skipped (with the reason) without CUDA or vLLM.

Run on a GPU node: `pytest -q -m gpu tests/gpu` (see tests/gpu/README.md). Models download from the Hugging Face
Hub unless VLLM_SMOKE_MODEL / VLLM_SMOKE_EMBED_MODEL point at local copies.
"""

from __future__ import annotations

import os

import pytest

from tests.gpu.run_vllm_smoke import check_embeddings, check_generation, gpu_unavailable_reason

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

_reason = gpu_unavailable_reason()
if _reason:
    pytest.skip(f"needs CUDA and vLLM: {_reason}", allow_module_level=True)

from batch_assets.resources.vllm_engine import VLLMEngineProvider  # noqa: E402


@pytest.fixture(scope="module")
def generator():
    provider = VLLMEngineProvider(
        model=os.environ.get("VLLM_SMOKE_MODEL", "Qwen/Qwen2.5-0.5B-Instruct"),
        runner="generate",
        max_model_len=2048,
        gpu_memory_utilization=0.4,
    ).load_for_tests()
    yield provider
    provider.teardown_after_execution(None)


def test_choice_and_json_generation_on_the_real_engine(generator):
    report = check_generation(generator, rows=64)
    assert report["failures"] == []


def test_embeddings_on_the_real_engine():
    provider = VLLMEngineProvider(
        model=os.environ.get("VLLM_SMOKE_EMBED_MODEL", "BAAI/bge-small-en-v1.5"),
        runner="pooling",
        gpu_memory_utilization=0.3,
    ).load_for_tests()
    assert check_embeddings(provider)["failures"] == []
