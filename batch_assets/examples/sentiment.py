"""Review sentiment for the `review_sentiment` example, in the `@daft.cls` shape.

The Daft post uses a Hugging Face sentiment pipeline (distilbert SST-2); no such model can be downloaded here, so
this class scores sentiment with the MiniLM embedding model that ships in a pip package: each review is compared to
a few clearly positive and clearly negative anchor sentences, and the closer side wins. It is a demonstration model,
good on plainly worded reviews; swap in a real sentiment checkpoint through `HFPipelineProvider` when one is at hand.

Use it from a pipeline spec:

    model:
      provider: custom
      config:
        class_path: batch_assets.examples.sentiment:ReviewSentiment
        init_kwargs: {text_column: review}
        batch_size: 256

The shape is `@daft.cls`'s (the model loads in `__init__`, once per process; a method runs per batch) with the batch
handed over as a dict of lists, as Ray's `map_batches` does. Under Daft itself the batch method would take Series
(`@daft.method.batch`); here no decorator is needed and Daft is not imported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

POSITIVE_ANCHORS = (
    "This product is amazing, I love it.",
    "Excellent quality, works perfectly and I would buy it again.",
    "Great value, very happy with this purchase.",
    "Fantastic service, highly recommended.",
)
NEGATIVE_ANCHORS = (
    "This product is terrible, I hate it.",
    "Awful quality, it broke right away and I want a refund.",
    "Worst purchase I've ever made, a complete waste of money.",
    "Horrible service, do not recommend.",
)


class ReviewSentiment:
    """`__call__(batch) -> {"sentiment": [...], "score": [...]}`: one label and one score per review."""

    def __init__(
        self,
        text_column: str = "review",
        model: str | None = None,
        device: str = "cpu",
        encode_batch_size: int = 32,
        temperature: float = 0.05,
    ):
        from sentence_transformers import SentenceTransformer

        from batch_assets.resources.hf.models import minilm_path  # an example user class: it loads the model it needs when built

        self.text_column = text_column
        self.encode_batch_size = encode_batch_size
        self.temperature = temperature
        self.model = SentenceTransformer(model or minilm_path(), device=device)
        # One centroid per side: averaging several anchors smooths out the wording of any single sentence.
        self.positive = self._centroid(POSITIVE_ANCHORS)
        self.negative = self._centroid(NEGATIVE_ANCHORS)

    def _encode(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts,
            batch_size=self.encode_batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )

    def _centroid(self, sentences: tuple[str, ...]) -> np.ndarray:
        mean = self._encode(list(sentences)).mean(axis=0)
        return mean / np.linalg.norm(mean)

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if self.text_column not in batch:
            raise KeyError(f"ReviewSentiment reads column {self.text_column!r}; the batch has {sorted(batch)}")
        texts = ["" if t is None else str(t) for t in batch[self.text_column]]
        vectors = self._encode(texts)
        margins = vectors @ self.positive - vectors @ self.negative
        sentiments = ["positive" if m > 0 else "negative" for m in margins.tolist()]
        # Probability-like confidence that the review is positive: logistic of the similarity margin.
        scores = [1.0 / (1.0 + math.exp(-m / self.temperature)) for m in margins.tolist()]
        return {"sentiment": sentiments, "score": scores}
