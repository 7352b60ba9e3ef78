"""Zero-shot text classification by embedding similarity, with the MiniLM model that ships offline.

Each label becomes a sentence (its description, or the hypothesis template filled with the label); texts and label
sentences are embedded with the same sentence-transformers model and each text takes the label whose sentence is
most similar. No classification head and no extra download: good for clearly separated topics, weaker than an NLI
model on subtle distinctions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import PrivateAttr, field_validator

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import ModelResource
from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder, cpu_encode_workers
from batch_assets.resources.hf.models import MINILM
from batch_assets.resources.protocols import Classification
from batch_assets.resources.tokens import encoder_limit


class ZeroShotEmbeddingClassifier(ModelResource):
    """`TextClassifier` over any sentence-transformers model (default: all-MiniLM-L6-v2, shipped in a package)."""

    model: str = semantic(
        default=MINILM,
        description=f"'{MINILM}' (shipped in that pip package), a local sentence-transformers folder, or a Hub id "
        "available offline.",
    )
    device: str = operational(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', ...")
    backend: Literal["auto", "torch", "onnx", "openvino"] = semantic(
        default="auto",
        description="What runs the model on the CPU, as for the sentence_transformers provider: 'auto' picks the "
        "fastest runtime whose vectors match torch's; 'torch', 'onnx', 'openvino' pin one.",
    )
    batch_size: int = operational(default=32, ge=1, description="Texts per forward pass (encode sorts each call by length).")
    cpu_workers: int = operational(
        default=1, ge=1, description="On CPU, chunks classified at once by the one model (see sentence_transformers).",
    )
    hypothesis_template: str = semantic(
        default="This text is about {label}.",
        description="Sentence embedded for a label without a description; must contain {label}.",
    )
    label_descriptions: dict[str, str] = semantic(
        default_factory=dict,
        description="label -> the sentence embedded for it, used verbatim instead of the template. Describe what "
        "texts of that label talk about: 'football, tennis, scores and matches' beats a bare 'sports'.",
    )
    score: Literal["softmax", "cosine"] = semantic(
        default="softmax",
        description="'softmax': probability over the candidate labels of softmax(cosine / temperature), comparable "
        "across rows; 'cosine': the raw cosine similarity to the chosen label, in [-1, 1].",
    )
    temperature: float = semantic(
        default=0.05,
        gt=0,
        description="softmax only: cosine similarities are divided by this (0.05 spreads MiniLM's narrow range of "
        "similarities into usable probabilities, as CLIP's logit scale does).",
    )

    _label_vectors: dict[tuple[str, ...], np.ndarray] = PrivateAttr(default_factory=dict)
    _backend: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("hypothesis_template")
    @classmethod
    def _template_has_label(cls, value: str) -> str:
        if "{label}" not in value:
            raise ValueError(f"hypothesis_template {value!r} must contain {{label}}")
        return value

    def load(self) -> Any:
        self._label_vectors = {}
        embedder = SentenceTransformerEmbedder(model=self.model, device=self.device, batch_size=self.batch_size,
                                               cpu_workers=self.cpu_workers, backend=self.backend)
        model = embedder.load()
        self._backend = embedder.describe()
        return model

    def chunks_in_flight(self, chunk_rows: int) -> int:
        return cpu_encode_workers(self.loaded, self.cpu_workers)

    def input_tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def max_input_tokens(self, params: Any = None, system: str | None = None) -> int | None:
        return encoder_limit(self.loaded.tokenizer, self.loaded.max_seq_length)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(score=self.score, hypothesis_template=self.hypothesis_template)
        out.update({k: v for k, v in self._backend.items() if k in ("backend", "backend_reason", "device")})
        return out

    def label_sentences(self, labels: Sequence[str]) -> list[str]:
        return [self.label_descriptions.get(label) or self.hypothesis_template.format(label=label) for label in labels]

    def _encode(self, texts: list[str]) -> np.ndarray:
        vectors = self.loaded.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def _labels_matrix(self, labels: tuple[str, ...]) -> np.ndarray:
        # Labels are the same for every chunk of a run: embed them once.
        if labels not in self._label_vectors:
            self._label_vectors[labels] = self._encode(self.label_sentences(labels))
        return self._label_vectors[labels]

    def classify(self, texts: Sequence[str], labels: Sequence[str]) -> list[Classification]:
        candidates = _check_labels(labels)
        results: list[Classification] = [
            Classification(label=None, error="text is empty or not a string") for _ in texts
        ]
        rows = [i for i, text in enumerate(texts) if isinstance(text, str) and text.strip()]
        if not rows:
            return results
        label_matrix = self._labels_matrix(candidates)
        sims = self._encode([texts[i] for i in rows]) @ label_matrix.T  # cosine: both sides are unit vectors
        best = sims.argmax(axis=1)
        if self.score == "softmax":
            logits = sims / self.temperature
            logits -= logits.max(axis=1, keepdims=True)
            probs = np.exp(logits)
            probs /= probs.sum(axis=1, keepdims=True)
            scores = probs[np.arange(len(rows)), best]
        else:
            scores = sims[np.arange(len(rows)), best]
        for row, choice, score in zip(rows, best.tolist(), scores.tolist()):
            results[row] = Classification(label=candidates[choice], score=float(score))
        return results


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    candidates = tuple(labels)
    if not candidates:
        raise ValueError("classify needs at least one candidate label")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidate labels repeat: {list(candidates)}")
    return candidates
