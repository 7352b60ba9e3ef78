"""Runs a sentence-transformers model exported to ONNX (resources/hf/onnx_export.py) with onnxruntime or OpenVINO,
behind the part of `SentenceTransformer`'s interface the providers use (`encode`, `tokenizer`, `max_seq_length`,
`device`, `get_embedding_dimension`), without importing torch once the export is cached.

Which backend runs a model (`backend: auto`, the default; `choose` in onnx_export.py): the first of `AUTO_ORDER`
whose runtime is installed and whose vectors matched torch's on the probe (min cosine >= 0.9999, measured at export
and kept in the cache's manifest); torch when none does, when the model runs on a GPU, or when it cannot be
exported. The order is fixed by measurement on the CI machine kind (docs/BENCHMARKS.md, "Runtimes for encoders"):
in a warmed process OpenVINO ran MiniLM faster than onnxruntime, and both faster than torch. A pinned backend that is not faithful, or not installed, fails the load
with the reason.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FIDELITY_MIN = 0.9999  # min cosine against torch's vectors for a runtime to be used by default


@dataclass(frozen=True)
class Exported:
    """A usable cache folder."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def graph(self) -> Path:
        return self.folder / "model.onnx"

    @property
    def tokenizer_file(self) -> Path:
        return self.folder / "tokenizer.json"

    def faithful(self, runtime: str) -> bool:
        score = self.manifest.get("fidelity", {}).get(runtime)
        return score is not None and score >= FIDELITY_MIN


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    return float(cos.min())


class ExportedEncoder:
    """`encode` over an exported graph: rows tokenized once, sorted by token length (less padding), batched, run,
    and put back in the caller's order."""

    device = "cpu"

    def __init__(self, exported: Exported, runtime: str, threads: int | None = None, precision: str = "f32"):
        self.exported = exported
        self.backend = runtime
        self.precision = precision  # f32 (torch's vectors), or bf16 with OpenVINO: the fast mode (precision.py)
        if precision != "f32" and runtime != "openvino":
            raise ValueError(f"precision {precision!r} runs with OpenVINO only, not {runtime!r}")
        self.max_seq_length = int(exported.manifest["max_seq_length"])
        self._dimension = int(exported.manifest["dimension"])
        self._inputs = list(exported.manifest["inputs"])
        self._pad_id = int(exported.manifest["pad_id"])
        self._hf_tokenizer: Any = None
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(exported.tokenizer_file))
        threads = threads or usable_cores()
        if runtime == "onnx":
            import onnxruntime as ort

            ort.disable_telemetry_events()  # ETW events, sent on Windows only (resources/telemetry.py)
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(str(exported.graph), options, providers=["CPUExecutionProvider"])
            self._run = lambda feeds: session.run(None, feeds)[0]
        elif runtime == "openvino":
            import openvino as ov

            # f32 explicitly: on CPUs with AMX/AVX512-BF16 OpenVINO would otherwise run in bf16 (not torch's vectors);
            # bf16 only when the fast mode was asked for and passed its probe (precision.py)
            compiled = ov.Core().compile_model(str(exported.graph), "CPU", {
                "INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": threads, "CACHE_DIR": str(exported.folder / "openvino")})
            local = threading.local()  # an infer request per thread: cpu_workers > 1 calls at once

            def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
                request = getattr(local, "request", None)
                if request is None:
                    request = local.request = compiled.create_infer_request()
                return request.infer(feeds)[0].copy()

            self._run = run
        else:
            raise ValueError(f"unknown runtime {runtime!r}")

    def get_embedding_dimension(self) -> int:
        return self._dimension

    @property
    def tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (what `prepare.max_input_tokens` counts with); loaded on first use
        only, as it imports transformers."""
        if self._hf_tokenizer is None:
            from transformers import AutoTokenizer

            self._hf_tokenizer = AutoTokenizer.from_pretrained(self.exported.manifest["model_folder"])
            self._hf_tokenizer.model_max_length = self.max_seq_length
        return self._hf_tokenizer

    def encode(self, sentences: Sequence[str], batch_size: int = 32, normalize_embeddings: bool = False,
               **_ignored: Any) -> np.ndarray:
        texts = [str(s) for s in sentences]
        out = np.empty((len(texts), self._dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(texts)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            width = int(lengths[rows[0]])
            ids = np.full((len(rows), width), self._pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            types = np.zeros((len(rows), width), dtype=np.int64)
            for i, row in enumerate(rows):
                e = encodings[row]
                n = len(e.ids)
                ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            out[rows] = self._run({k: feeds[k] for k in self._inputs})
        if normalize_embeddings:  # as torch.nn.functional.normalize (eps 1e-12)
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out
