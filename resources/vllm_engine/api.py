"""The vLLM classes the provider uses, gathered in one place: the seam between the provider and vLLM.

`VLLMEngineProvider.vllm_api` is the import path ("module:function") of a function returning a `VLLMApi`. The
default, `import_vllm_api`, imports the real vLLM. Tests on machines without CUDA point it at
`tests.resources.vllm_engine.vllm_standin:standin_vllm_api`, which swaps in a recording stand-in for `LLM` but keeps vLLM's
own `SamplingParams` / `StructuredOutputsParams` / `LoRARequest` whenever vLLM is importable (look-alike
dataclasses with the same field names otherwise). Because the seam is a config string, it survives Dagster
copying the resource and reaches step subprocesses and pods unchanged.

Written against vLLM 0.33.0 (`vllm.LLM.chat` / `LLM.embed`, `SamplingParams(structured_outputs=
StructuredOutputsParams(...))`); vLLM 0.10-0.11, where the same params class is `GuidedDecodingParams` and the
field `guided_decoding`, are handled here too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from batch_assets.resources.provider_errors import MissingExtraError

DEFAULT_API = "batch_assets.resources.vllm_engine.api:import_vllm_api"


@dataclass(frozen=True)
class VLLMApi:
    """What the provider needs from vLLM. Every attribute is a vLLM class (or, in tests, its stand-in)."""

    LLM: Any  # the engine: LLM(model=..., **engine_args) with .chat(...) and .embed(...)
    SamplingParams: Any
    StructuredOutputsParams: Any  # GuidedDecodingParams before vLLM 0.12
    structured_field: str  # the SamplingParams field that takes it: "structured_outputs" or "guided_decoding"
    LoRARequest: Any
    version: str


def import_vllm_api() -> VLLMApi:
    """The real vLLM. Raises MissingExtraError (naming the `vllm` extra) when it is not installed."""
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise MissingExtraError(
            "vllm", "vllm", "the vLLM engine provider (CUDA GPUs only; use 'transformers' on CPU)"
        ) from exc
    try:
        from vllm.sampling_params import StructuredOutputsParams

        field = "structured_outputs"
    except ImportError:  # vLLM < 0.12
        from vllm.sampling_params import GuidedDecodingParams as StructuredOutputsParams

        field = "guided_decoding"
    return VLLMApi(LLM, SamplingParams, StructuredOutputsParams, field, LoRARequest, str(vllm.__version__))


def load_vllm_api(target: str) -> VLLMApi:
    """Resolve `vllm_api` ("module:function") and call it."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"vllm_api {target!r} must look like 'package.module:function'")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory):
        raise ValueError(f"vllm_api {target!r}: {attr!r} is not a function in {module_name!r}")
    return factory()


def field_names(cls: Any) -> frozenset[str]:
    """The keyword arguments a params class accepts (dataclass, msgspec.Struct or plain class)."""
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    if hasattr(cls, "__struct_fields__"):  # msgspec.Struct: vLLM's SamplingParams and LoRARequest
        return frozenset(cls.__struct_fields__)
    return frozenset(p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs"))
