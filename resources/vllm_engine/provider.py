"""vLLM offline engine as a model provider: `LLM.chat` for generation, `LLM.embed` for embeddings.

Written against vLLM 0.33.0 (the release on PyPI when this was written; `pip install 'batch-assets[vllm]'` on a
CUDA node). vLLM >= 0.12 takes structured outputs as `SamplingParams(structured_outputs=StructuredOutputsParams(
choice=... | regex=... | json=...))`; 0.10-0.11 as `guided_decoding=GuidedDecodingParams(...)`; both are handled
(`resources/vllm_engine/api.py`).

Each `generate()` call hands the engine every row of the chunk in one `LLM.chat` call (vLLM schedules and batches
them itself), ordered so that conversations sharing a prefix are adjacent (prefix caching reuses their KV blocks),
and maps the outputs back to the caller's order. One engine serves either generation or embeddings, whichever the
model is (`runner`).

The engine is built in `load()` by `build_engine(provider, api)` from the classes `vllm_api` names: the real vLLM
by default, a recording stand-in in tests (see `api.py`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import PrivateAttr

import dagster as dg

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import GPU_STRATEGY_ENV, ModelResource, granted_gpus
from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.schema_support import VLLM, warn_unenforced
from batch_assets.resources.structured import StructuredOutput
from batch_assets.resources.tokens import generation_limit
from batch_assets.resources.vllm_engine.api import DEFAULT_API, VLLMApi, load_vllm_api
from batch_assets.resources.vllm_engine.replicas import ReplicaSet, replica_devices
from batch_assets.resources.vllm_engine.requests import prefix_order, run_chat, run_embed

# Engine arguments the provider sets from its own fields; `engine_kwargs` may not repeat them.
_OWNED_ENGINE_ARGS = frozenset(
    {
        "model", "runner", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
        "enable_prefix_caching", "dtype", "quantization", "seed", "enable_lora", "max_loras", "max_lora_rank",
    }
)


def visible_gpu_count() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES, as set by Kubernetes' device plugin, is respected)."""
    try:
        import torch

        return int(torch.cuda.device_count())
    except ImportError:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return len([d for d in visible.split(",") if d.strip()]) if visible else 0


def default_tensor_parallel_size() -> int:
    """The step's GPU grant from the batch Kubernetes executor (BATCH_INFER_GPUS), else every visible GPU."""
    return granted_gpus() or max(1, visible_gpu_count())


class VLLMEngineProvider(ModelResource):
    """Offline batch inference with vLLM's `LLM` engine on the GPUs of this process (one step, one pod)."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"vllm"})
    runs_replicas: ClassVar[bool] = True  # one engine process per GPU (replicas.py)
    runs_tensor_parallel: ClassVar[bool] = True

    @classmethod
    def replicas_config_problem(cls, config: dict[str, Any]) -> str | None:
        if (config.get("tensor_parallel_size") or 1) != 1:
            return (f"model.config.tensor_parallel_size is {config['tensor_parallel_size']}: each vLLM replica runs "
                    "on one GPU (remove tensor_parallel_size, or use gpu_strategy: tensor_parallel)")
        return None

    model: str = semantic(description="Hugging Face id or local path of the model (a generative or an embedding model).")
    runner: Literal["auto", "generate", "pooling"] = semantic(
        default="auto", description="vLLM runner: 'generate' for chat models, 'pooling' for embedding models."
    )
    tensor_parallel_size: int | None = operational(
        default=None,
        ge=1,
        description="GPUs to shard the model over. Default: the GPUs the executor gave the step (BATCH_INFER_GPUS, "
        "set per partition by runtime.resources), else every GPU visible to the process. With gpu_strategy "
        "replicas: 1 (one engine per GPU; another value is refused).",
    )
    gpu_memory_utilization: float = operational(
        default=0.9, gt=0.0, le=1.0, description="Share of each GPU's memory vLLM may take (weights + KV cache)."
    )
    max_model_len: int | None = semantic(
        default=None, ge=1, description="Context length cap; lower it to fit a long-context model's KV cache."
    )
    enable_prefix_caching: bool = operational(
        default=True, description="Reuse KV blocks across rows sharing a prompt prefix (system prompt, few-shot)."
    )
    dtype: str = semantic(default="auto", description="'auto', 'bfloat16', 'float16' or 'float32'.")
    quantization: str | None = semantic(default=None, description="vLLM quantization method, e.g. 'awq', 'gptq', 'fp8'.")
    seed: int = semantic(default=0, description="Engine seed; GenerationParams.seed sets a per-request seed on top.")
    lora_adapters: dict[str, str] = semantic(
        default_factory=dict,
        description="LoRA adapters by name -> local path. Non-empty turns on enable_lora in the engine.",
    )
    lora: str | None = semantic(
        default=None, description="Name of the adapter (in `lora_adapters`) applied to every request; default: the "
        "only adapter when there is exactly one, else none.",
    )
    max_lora_rank: int | None = operational(default=None, ge=1, description="Largest LoRA rank among the adapters.")
    chat_template_kwargs: dict[str, Any] = semantic(
        default_factory=dict, description="Passed to the chat template, e.g. {'enable_thinking': false} for Qwen3."
    )
    json_any_whitespace: bool = semantic(
        default=False,
        description="JSON-schema outputs may contain free whitespace (off: compact JSON, fewer tokens, no runaway "
        "newlines).",
    )
    normalize_embeddings: bool = semantic(default=False, description="L2-normalise vectors returned by embed().")
    engine_kwargs: dict[str, Any] = semantic(
        default_factory=dict,
        description="Further vllm.LLM / EngineArgs keyword arguments (enforce_eager, max_num_seqs, "
        "kv_cache_dtype, ...).",
    )
    vllm_api: str = semantic(
        default=DEFAULT_API,
        description="Import path of the function returning the vLLM classes to use. Leave the default; tests set "
        "'tests.resources.vllm_engine.vllm_standin:standin_vllm_api'.",
    )

    _api: VLLMApi | None = PrivateAttr(default=None)

    # -- set-up ----------------------------------------------------------------------------------------------------
    def active_lora(self) -> str | None:
        if self.lora is not None:
            if self.lora not in self.lora_adapters:
                raise ValueError(f"lora {self.lora!r} is not in lora_adapters ({sorted(self.lora_adapters)})")
            return self.lora
        return next(iter(self.lora_adapters)) if len(self.lora_adapters) == 1 else None

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM`."""
        clash = sorted(set(self.engine_kwargs) & _OWNED_ENGINE_ARGS)
        if clash:
            raise ValueError(f"engine_kwargs {clash} repeat provider fields; set those fields instead")
        args: dict[str, Any] = {
            "model": self.model,
            "runner": self.runner,
            "tensor_parallel_size": 1 if self.replica_count() > 1 else (
                self.tensor_parallel_size or default_tensor_parallel_size()),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
            "dtype": self.dtype,
            "seed": self.seed,
        }
        if self.max_model_len is not None:
            args["max_model_len"] = self.max_model_len
        if self.quantization is not None:
            args["quantization"] = self.quantization
        if self.lora_adapters:
            args.update(enable_lora=True, max_loras=len(self.lora_adapters))
            if self.max_lora_rank is not None:
                args["max_lora_rank"] = self.max_lora_rank
        return {**args, **self.config_value("engine_kwargs")}

    def load(self) -> Any:
        self.active_lora()  # a misnamed adapter fails before minutes of engine start-up
        api = load_vllm_api(self.vllm_api)
        self._api = api
        replicas = self.replica_count()
        if replicas > 1:
            return ReplicaSet.start(replica_devices(replicas), self.vllm_api, self.engine_args())
        return build_engine(self, api)

    def replica_count(self) -> int:
        """Engines to run: the step's GPU grant under gpu_strategy replicas (BATCH_GPU_STRATEGY=replicas, set by the
        executor from runtime.resources), else 1 engine over every GPU (tensor parallel)."""
        if os.environ.get(GPU_STRATEGY_ENV, "").strip() != "replicas":
            return 1
        if (self.tensor_parallel_size or 1) != 1:
            raise ValueError(f"gpu_strategy replicas runs one engine per GPU, but tensor_parallel_size is "
                             f"{self.tensor_parallel_size}: remove it, or use gpu_strategy tensor_parallel")
        return default_tensor_parallel_size()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(
            tensor_parallel_size=self.tensor_parallel_size or "all visible GPUs",
            dtype=self.dtype,
            enable_prefix_caching=self.enable_prefix_caching,
        )
        if self.quantization:
            out["quantization"] = self.quantization
        if self.max_model_len:
            out["max_model_len"] = self.max_model_len
        if self.active_lora():
            out["lora"] = self.active_lora()
        if isinstance(self._model, ReplicaSet):  # gpu_strategy replicas: one engine per GPU
            out.update(tensor_parallel_size=1, replicas=len(self._model.replicas),
                       replica_gpus=",".join(r.device for r in self._model.replicas))
        if self._api is not None:
            out["vllm_version"] = self._api.version
        return out

    @property
    def api(self) -> VLLMApi:
        self.loaded  # noqa: B018 - raises the "used before load" error
        assert self._api is not None
        return self._api

    def lora_request(self) -> Any:
        lora = self._lora()
        return None if lora is None else self.api.LoRARequest(*lora)

    def input_tokenizer(self) -> Any:
        return self.loaded.get_tokenizer()  # vLLM's documented LLM.get_tokenizer(): the model's HF tokenizer

    def max_input_tokens(self, params: GenerationParams | None, system: str | None = None) -> int | None:
        if isinstance(self.loaded, ReplicaSet):
            context = self.max_model_len or self.loaded.max_model_len
        else:
            config = getattr(getattr(self.loaded, "llm_engine", None), "model_config", None)
            context = self.max_model_len or getattr(config, "max_model_len", None)
        return generation_limit(self.input_tokenizer(), context, params, system)

    # -- capabilities ----------------------------------------------------------------------------------------------
    def _lora(self) -> tuple[str, int, str] | None:
        """The active adapter as LoRARequest's (name, id, path); ids must be positive and stable per adapter."""
        name = self.active_lora()
        return None if name is None else (name, sorted(self.lora_adapters).index(name) + 1, self.lora_adapters[name])

    def generate(self, conversations: Sequence[Conversation], params: GenerationParams) -> list[Generation]:
        if not conversations:
            return []
        StructuredOutput.from_params(params)  # refuses two constraints before any GPU work
        warn_unenforced(params.json_schema, VLLM, who=f"{type(self).__name__} (model {self.model!r})")
        options = {"json_any_whitespace": self.json_any_whitespace, "lora": self._lora(),
                   "chat_template_kwargs": self.config_value("chat_template_kwargs") or None}
        if isinstance(self.loaded, ReplicaSet):
            return self.loaded.generate(conversations, prefix_order(conversations), params, options)
        return run_chat(self.loaded, self.api, conversations, params, **options)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if isinstance(self.loaded, ReplicaSet):
            vectors = self.loaded.embed(list(texts), self._lora())
        else:
            vectors = run_embed(self.loaded, self.api, list(texts), self._lora())
        if self.normalize_embeddings:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms == 0, 1.0, norms)
        return vectors

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if isinstance(self._model, ReplicaSet):
            self._model.close()  # every replica's worker exits (and frees its GPU) before the step ends
        super().teardown_after_execution(context)


def build_engine(provider: VLLMEngineProvider, api: VLLMApi) -> Any:
    """Start the engine: `vllm.LLM(**engine_args)` (or the stand-in `api.LLM` in tests). Slow: loads weights,
    profiles memory and captures CUDA graphs."""
    return api.LLM(**provider.engine_args())
