"""`gpu_strategy: replicas` for the vLLM provider: one engine per GPU, each in its own worker process.

A step given N GPUs with `runtime.resources.gpu_strategy: replicas` (the executor sets BATCH_INFER_GPUS=N and
BATCH_GPU_STRATEGY=replicas on the pod) starts N worker processes. Each is started with CUDA_VISIBLE_DEVICES set to
its one GPU, builds its own `vllm.LLM(tensor_parallel_size=1, ...)` once, and serves every call of the step.

This follows vLLM's documented offline data parallelism (examples/offline_inference/data_parallel.py: one process
per data-parallel rank, CUDA_VISIBLE_DEVICES set per rank, an `LLM` in each, each rank given its own share of the
prompts). It does NOT set the example's VLLM_DP_RANK / VLLM_DP_SIZE / VLLM_DP_MASTER_* variables: those join the
ranks into one data-parallel group whose forward passes are kept in lock-step (dummy batches on idle ranks), which
MoE models with expert parallelism need and dense models do not. Here each chunk's share per GPU differs in size,
and independent engines never wait for one another. (MoE expert parallelism across GPUs: use tensor_parallel.)

Each call splits its rows over the replicas in prefix order (conversations sharing a system prompt or few-shot turns
stay on one replica, whose prefix cache serves them), runs the shares concurrently and puts results back in the
caller's order. A replica that raises or dies fails the call with the GPU index named.

Workers are `concurrent.futures.ProcessPoolExecutor(max_workers=1)` pools started with the `spawn` method (CUDA
cannot be used in a forked child), so each replica is one long-lived process holding one engine. Their workers are
not daemonic (Python >= 3.9), so vLLM may start its own EngineCore process inside each;
`ReplicaSet.close()` (the provider's teardown) shuts them down and waits for them to exit.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.vllm_engine.api import load_vllm_api
from batch_assets.resources.vllm_engine.requests import run_chat, run_embed

# -- in the worker process -------------------------------------------------------------------------------------------
_ENGINE: Any = None
_API: Any = None


def _init_worker(devices: str) -> None:
    """Pool initializer: runs first in the fresh (spawned) process, before anything imports torch or vLLM."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices


def _build(api_target: str, engine_args: dict[str, Any]) -> dict[str, Any]:
    global _ENGINE, _API
    _API = load_vllm_api(api_target)
    _ENGINE = _API.LLM(**engine_args)
    config = getattr(getattr(_ENGINE, "llm_engine", None), "model_config", None)
    return {"pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "max_model_len": getattr(config, "max_model_len", None)}


def _generate(conversations: list[Conversation], params: GenerationParams, options: dict[str, Any]) -> list[Generation]:
    return run_chat(_ENGINE, _API, conversations, params, **options)


def _embed(texts: list[str], lora: tuple[str, int, str] | None) -> np.ndarray:
    return run_embed(_ENGINE, _API, texts, lora)


def _tokenizer() -> Any:
    return _ENGINE.get_tokenizer()


# -- in the step's process -------------------------------------------------------------------------------------------
def replica_devices(count: int) -> list[str]:
    """The device id each replica gets: the entries of this process's CUDA_VISIBLE_DEVICES when it is set (a
    bare-metal host), else 0..count-1 (a pod, where the device plugin exposes only the granted GPUs)."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if visible and len(visible) < count:
        raise ValueError(f"gpu_strategy replicas over {count} GPUs, but CUDA_VISIBLE_DEVICES names only "
                         f"{len(visible)} ({','.join(visible)})")
    return visible[:count] if visible else [str(i) for i in range(count)]


def split(order: Sequence[int], parts: int) -> list[list[int]]:
    """`order` cut into at most `parts` contiguous, near-equal slices (none empty)."""
    parts = max(1, min(parts, len(order)))
    size, extra = divmod(len(order), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(list(order[start:end]))
        start = end
    return out


@dataclass
class Replica:
    device: str
    pool: ProcessPoolExecutor
    pid: int | None = None


@dataclass
class ReplicaSet:
    """N engines, one per GPU, each in its own worker process (what `VLLMEngineProvider.load()` returns for
    gpu_strategy replicas)."""

    replicas: list[Replica]
    max_model_len: int | None = None
    _tokenizer: Any = field(default=None, repr=False)

    @classmethod
    def start(cls, devices: Sequence[str], api_target: str, engine_args: dict[str, Any]) -> "ReplicaSet":
        context = multiprocessing.get_context("spawn")
        replicas = [Replica(d, ProcessPoolExecutor(1, mp_context=context, initializer=_init_worker, initargs=(d,)))
                    for d in devices]
        out = cls(replicas)
        try:
            # Engines load concurrently (each loads the weights onto its own GPU).
            infos = out._run_all([(r, _build, (api_target, engine_args)) for r in replicas], "could not start")
        except BaseException:
            out.close()
            raise
        for replica, info in zip(replicas, infos):
            replica.pid = info["pid"]
        out.max_model_len = infos[0]["max_model_len"]
        return out

    @property
    def pids(self) -> list[int | None]:
        return [r.pid for r in self.replicas]

    def _run_all(self, calls: list[tuple[Replica, Callable[..., Any], tuple[Any, ...]]], doing: str) -> list[Any]:
        futures: list[Future] = [replica.pool.submit(fn, *args) for replica, fn, args in calls]
        results, failures = [], []
        for (replica, _, _), future in zip(calls, futures):
            try:
                results.append(future.result())
            except BrokenProcessPool:
                failures.append(f"the vLLM replica on GPU {replica.device} (worker pid {replica.pid or '?'}) "
                                "exited while it worked (killed: out of host memory, a CUDA crash or a signal; its "
                                "log lines above say which)")
            except Exception as exc:  # raised inside the worker and pickled back
                failures.append(f"the vLLM replica on GPU {replica.device} (worker pid {replica.pid or '?'}) "
                                f"{doing}: {type(exc).__name__}: {exc}")
        if failures:
            raise RuntimeError("; ".join(failures))
        return results

    def generate(self, conversations: Sequence[Conversation], order: Sequence[int], params: GenerationParams,
                 options: dict[str, Any]) -> list[Generation]:
        """Rows in `order` (prefix order) cut into one contiguous share per replica; results in the caller's order."""
        shares = split(order, len(self.replicas))
        calls = [(r, _generate, ([list(conversations[i]) for i in share], params, options))
                 for r, share in zip(self.replicas, shares)]
        results: list[Generation | None] = [None] * len(conversations)
        for share, generations in zip(shares, self._run_all(calls, "failed on its share of the chunk")):
            if len(generations) != len(share):
                raise RuntimeError(f"a vLLM replica returned {len(generations)} results for {len(share)} rows")
            for row, generation in zip(share, generations):
                results[row] = generation
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"vLLM replicas returned no result for rows {missing[:10]} of this chunk")
        return results  # type: ignore[return-value]

    def embed(self, texts: Sequence[str], lora: tuple[str, int, str] | None) -> np.ndarray:
        shares = split(range(len(texts)), len(self.replicas))
        calls = [(r, _embed, ([texts[i] for i in share], lora)) for r, share in zip(self.replicas, shares)]
        return np.concatenate(self._run_all(calls, "failed on its share of the chunk"), axis=0)

    def get_tokenizer(self) -> Any:
        """The model's tokenizer, fetched once from the first replica (vLLM's LLM.get_tokenizer(); its cached
        tokenizer wrapper pickles through `__reduce__` -> get_cached_tokenizer). Not exercised by the stand-in."""
        if self._tokenizer is None:
            (self._tokenizer,) = self._run_all([(self.replicas[0], _tokenizer, ())], "could not give its tokenizer")
        return self._tokenizer

    def close(self) -> None:
        """Stop every worker and wait for it to exit (engines free their GPU memory with their process)."""
        for replica in self.replicas:
            replica.pool.shutdown(wait=True, cancel_futures=True)
