"""A transformers `pipeline` over a local model folder: text classification or NLI zero-shot classification.

Any fine-tuned sequence-classification checkpoint saved with `save_pretrained` (model + tokenizer in one folder)
works; nothing is downloaded at run time, so `model` must be a folder on disk (or a Hub id already in the local
cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import ModelResource, resolve_device
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.protocols import Classification
from batch_assets.resources.tokens import encoder_limit


class HFPipelineProvider(ModelResource):
    """`TextClassifier` and `BatchPredictor` over `transformers.pipeline(task, model=<folder>)`."""

    model: str = semantic(description="Folder holding the model and tokenizer (save_pretrained output).")
    task: Literal["text-classification", "zero-shot-classification"] = semantic(
        default="text-classification",
        description="'text-classification': the model's own labels (config.id2label); 'zero-shot-classification': "
        "an NLI model (labels entailment / neutral / contradiction) scoring any candidate labels.",
    )
    device: str = operational(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', ...")
    batch_size: int = operational(default=32, ge=1, description="Texts per forward pass inside the pipeline.")
    label_map: dict[str, str] = semantic(
        default_factory=dict,
        description="text-classification: rename the model's labels ('LABEL_0' -> 'negative', 'POSITIVE' -> "
        "'positive') so they match the pipeline's candidate labels.",
    )
    hypothesis_template: str = semantic(
        default="This text is about {}.",
        description="zero-shot-classification: the NLI hypothesis; {} is replaced by each candidate label.",
    )
    candidate_labels: list[str] = semantic(
        default_factory=list,
        description="predict(): the labels to choose from (zero-shot needs them; text-classification defaults to "
        "all of the model's labels).",
    )
    text_column: str = semantic(default="text", description="predict(): the input column holding the text.")

    def load(self) -> Any:
        try:
            from transformers import pipeline
        except ImportError as exc:
            raise MissingExtraError("transformers", "local", "the transformers pipeline provider") from exc
        folder = Path(self.model).expanduser()
        save_hint = (
            "point `model` at a folder written by model.save_pretrained(...) and tokenizer.save_pretrained(...) "
            "(models are never downloaded at run time)"
        )
        if folder.exists():
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json: {save_hint}")
            source = str(folder)
        elif self.model.startswith((".", "/", "~")):
            raise FileNotFoundError(f"model folder {str(folder)!r} does not exist: {save_hint}")
        else:
            source = self.model  # a Hub id: loads only if it is already in the local cache
        return pipeline(self.task, model=source, device=resolve_device(self.device))

    def input_tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def max_input_tokens(self, params: Any = None, system: str | None = None) -> int | None:
        return encoder_limit(self.loaded.tokenizer, getattr(self.loaded.tokenizer, "model_max_length", None))

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["task"] = self.task
        return out

    def model_labels(self) -> list[str]:
        """The model's own labels after `label_map`, in id order (text-classification)."""
        id2label = self.loaded.model.config.id2label
        return [self.label_map.get(id2label[i], id2label[i]) for i in sorted(id2label)]

    def classify(self, texts: Sequence[str], labels: Sequence[str]) -> list[Classification]:
        results = [Classification(label=None, error="text is empty or not a string") for _ in texts]
        rows = [i for i, text in enumerate(texts) if isinstance(text, str) and text.strip()]
        if self.task == "zero-shot-classification":
            outputs = self._zero_shot([texts[i] for i in rows], labels)
        else:
            outputs = self._text_classification([texts[i] for i in rows], labels)
        for row, result in zip(rows, outputs):
            results[row] = result
        return results

    def predict(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if self.text_column in batch:
            texts = batch[self.text_column]
        elif len(batch) == 1:
            texts = next(iter(batch.values()))
        else:
            raise KeyError(
                f"HFPipelineProvider.predict reads column {self.text_column!r}, which is not among {sorted(batch)}: "
                "set text_column"
            )
        labels = self.candidate_labels or (self.model_labels() if self.task == "text-classification" else [])
        out = self.classify(list(texts), labels)
        return {
            "label": [c.label for c in out],
            "score": [c.score for c in out],
            "error": [c.error for c in out],
        }

    # -- internals -------------------------------------------------------------------------------------------------
    def _text_classification(self, texts: list[str], labels: Sequence[str]) -> list[Classification]:
        known = self.model_labels()
        wanted = [label for label in labels if label in known] if labels else known
        if not wanted:
            raise ValueError(
                f"none of the candidate labels {list(labels)} is a label of model {self.model!r}, whose labels are "
                f"{known}: use those labels, or map them with label_map"
            )
        if not texts:
            return []
        outputs = self.loaded(texts, top_k=None, batch_size=self.batch_size, truncation=True)
        results = []
        for scores in outputs:
            by_label = {self.label_map.get(s["label"], s["label"]): float(s["score"]) for s in scores}
            # The model's probability for the best allowed label; not renormalised over the allowed subset.
            best = max(wanted, key=lambda label: by_label.get(label, float("-inf")))
            results.append(Classification(label=best, score=by_label.get(best)))
        return results

    def _zero_shot(self, texts: list[str], labels: Sequence[str]) -> list[Classification]:
        if not labels:
            raise ValueError("zero-shot-classification needs candidate labels (task.labels or candidate_labels)")
        if not texts:
            return []
        outputs = self.loaded(
            texts,
            candidate_labels=list(labels),
            hypothesis_template=self.hypothesis_template,
            multi_label=False,
            batch_size=self.batch_size,
        )
        if isinstance(outputs, dict):
            outputs = [outputs]
        return [Classification(label=o["labels"][0], score=float(o["scores"][0])) for o in outputs]
