"""Image embeddings and image classification: CLIP via sentence-transformers, or a custom torch module.

- `model`: a sentence-transformers model that accepts images (CLIP and other multimodal checkpoints; a local
  folder, or a Hub id already in the local cache). It has a text side too, so labels are classified by the
  similarity of each image to "a photo of a {label}." and `embed(texts)` gives vectors in the same space.
- `torch_module`: 'package.module:factory' returning an `nn.Module` that maps a float tensor (N, 3, H, W) to
  (N, D) vectors, plus optional `preprocess` ('package.module:function', one image -> (3, H, W) tensor). Such a
  model has no text side: it classifies by nearest label prototype, the mean vector of `label_examples` images.

Images arrive decoded (PIL images or HxWxC uint8 arrays): decoding and resizing belong to the prepare stage
(`batch_assets.resources.multimodal.load_image`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from pydantic import PrivateAttr, field_validator, model_validator

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import ModelResource, resolve_device
from batch_assets.resources.custom.loading import ImportPathError, import_object, source_files
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.multimodal import load_image
from batch_assets.resources.protocols import Classification
from batch_assets.resources.vision.preprocess import IMAGENET_MEAN, IMAGENET_STD, default_preprocess, to_rgb_array


@dataclass
class _Loaded:
    kind: str  # "sentence_transformers" | "torch"
    model: Any
    device: str
    preprocess: Callable[[Any], Any] | None = None
    prototypes: dict[str, np.ndarray] = field(default_factory=dict)  # label -> unit vector


class ImageModelProvider(ModelResource):
    """`ImageEmbedder` + `ImageClassifier` (+ `TextEmbedder` for CLIP's text side)."""

    model: str | None = semantic(
        default=None,
        description="sentence-transformers model that accepts images (e.g. a CLIP folder saved with "
        "SentenceTransformer.save). Exactly one of model / torch_module.",
    )
    torch_module: str | None = semantic(
        default=None,
        description="'package.module:factory' returning a torch nn.Module: (N, 3, H, W) float -> (N, D) vectors.",
    )
    torch_module_kwargs: dict[str, Any] = semantic(
        default_factory=dict, description="Keyword arguments for the torch_module factory (weights path, ...)."
    )
    preprocess: str | None = semantic(
        default=None,
        description="torch_module: 'package.module:function' turning one image into a (3, H, W) tensor. Default: "
        "RGB, resize to image_size x image_size, scale to [0, 1], normalise with mean / std.",
    )
    image_size: int = semantic(default=224, ge=8, description="torch_module default preprocessing: square side.")
    mean: list[float] = semantic(default_factory=lambda: list(IMAGENET_MEAN), description="Per-channel mean.")
    std: list[float] = semantic(default_factory=lambda: list(IMAGENET_STD), description="Per-channel std.")
    device: str = operational(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', ...")
    batch_size: int = operational(default=32, ge=1, description="Images per forward pass.")
    normalize: bool = semantic(default=True, description="L2-normalise vectors (cosine similarity = dot product).")
    label_template: str = semantic(
        default="a photo of a {label}.",
        description="CLIP text side: the sentence embedded for each candidate label; must contain {label}.",
    )
    label_examples: dict[str, list[str]] = semantic(
        default_factory=dict,
        description="label -> example images (paths, s3:// or http(s):// URLs). Each label's prototype is the mean "
        "of its examples' vectors; when given, classify_images uses prototypes instead of the text side. Required "
        "to classify with a torch_module.",
    )
    temperature: float = semantic(
        default=0.01,
        gt=0,
        description="Scores are softmax(cosine / temperature) over the candidate labels (0.01 = CLIP's logit scale "
        "of 100).",
    )

    _text_vectors: dict[tuple[str, ...], np.ndarray] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _one_backend(self) -> ImageModelProvider:
        if (self.model is None) == (self.torch_module is None):
            raise ValueError(
                "ImageModelProvider needs exactly one of `model` (a sentence-transformers / CLIP model) or "
                "`torch_module` ('package.module:factory' of a torch nn.Module)"
            )
        return self

    @field_validator("label_template")
    @classmethod
    def _template_has_label(cls, value: str) -> str:
        if "{label}" not in value:
            raise ValueError(f"label_template {value!r} must contain {{label}}")
        return value

    def model_name(self) -> str:
        return str(self.model or self.torch_module)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["backend"] = "sentence_transformers" if self.model else "torch"
        if self.label_examples:
            out["labels_from_examples"] = sorted(self.label_examples)
        return out

    def user_code_files(self) -> list[str]:
        return source_files(self.torch_module, self.preprocess)

    # -- loading -----------------------------------------------------------------------------------------------
    def load(self) -> _Loaded:
        self._text_vectors = {}
        device = resolve_device(self.device)
        loaded = self._load_sentence_transformer(device) if self.model else self._load_torch_module(device)
        if self.label_examples:
            loaded.prototypes = self._prototypes(loaded)
        return loaded

    def _load_sentence_transformer(self, device: str) -> _Loaded:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise MissingExtraError("sentence-transformers", "local", "the CLIP image provider") from exc
        model = SentenceTransformer(self.model, device=device)
        return _Loaded(kind="sentence_transformers", model=model, device=device)

    def _load_torch_module(self, device: str) -> _Loaded:
        import torch

        factory = import_object(str(self.torch_module), "torch_module")
        module = factory(**self.config_value("torch_module_kwargs"))
        if not isinstance(module, torch.nn.Module):
            raise ImportPathError(
                f"torch_module {self.torch_module!r} returned a {type(module).__name__}, not a torch.nn.Module: "
                "point it at a function (or class) that builds the model"
            )
        if self.preprocess:
            preprocess = import_object(self.preprocess, "preprocess")
        else:
            preprocess = partial(default_preprocess, size=self.image_size, mean=self.mean, std=self.std)
        return _Loaded(kind="torch", model=module.to(device).eval(), device=device, preprocess=preprocess)

    def _prototypes(self, loaded: _Loaded) -> dict[str, np.ndarray]:
        prototypes = {}
        for label, refs in self.label_examples.items():
            if not refs:
                raise ValueError(f"label_examples[{label!r}] is empty: give at least one example image")
            vectors = _unit(self._embed(loaded, [load_image(ref) for ref in refs]))
            prototypes[label] = _unit(vectors.mean(axis=0, keepdims=True))[0]
        return prototypes

    # -- capabilities --------------------------------------------------------------------------------------------
    def embed_images(self, images: Sequence[Any]) -> np.ndarray:
        return self._embed(self.loaded, images)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """CLIP text side: text vectors in the same space as the image vectors."""
        loaded = self.loaded
        if loaded.kind != "sentence_transformers":
            raise TypeError(
                f"ImageModelProvider with torch_module {self.torch_module!r} has no text side: embed texts with a "
                "text model, or use a CLIP model through `model`"
            )
        return self._encode_st(loaded, list(texts), normalize=self.normalize)

    def classify_images(self, images: Sequence[Any], labels: Sequence[str]) -> list[Classification]:
        candidates = tuple(labels)
        if not candidates or len(set(candidates)) != len(candidates):
            raise ValueError(f"classify_images needs distinct candidate labels, got {list(candidates)}")
        loaded = self.loaded
        label_matrix = self._label_matrix(loaded, candidates)
        results = [Classification(label=None, error="no image") for _ in images]
        rows = [i for i, image in enumerate(images) if image is not None]
        if not rows:
            return results
        sims = _unit(self._embed(loaded, [images[i] for i in rows])) @ label_matrix.T
        logits = sims / self.temperature
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        for row, choice, prob in zip(rows, probs.argmax(axis=1).tolist(), probs.max(axis=1).tolist()):
            results[row] = Classification(label=candidates[choice], score=float(prob))
        return results

    # -- internals -----------------------------------------------------------------------------------------------
    def _label_matrix(self, loaded: _Loaded, candidates: tuple[str, ...]) -> np.ndarray:
        if loaded.prototypes:
            missing = [label for label in candidates if label not in loaded.prototypes]
            if missing:
                raise ValueError(
                    f"labels {missing} have no label_examples; examples are given for {sorted(loaded.prototypes)}"
                )
            return np.stack([loaded.prototypes[label] for label in candidates])
        if loaded.kind != "sentence_transformers":
            raise ValueError(
                f"torch_module {self.torch_module!r} has no text side to compare labels with: set label_examples "
                "(label -> example images), or run your own classifier class with the 'custom' provider"
            )
        if candidates not in self._text_vectors:
            sentences = [self.label_template.format(label=label) for label in candidates]
            self._text_vectors[candidates] = self._encode_st(loaded, sentences, normalize=True)
        return self._text_vectors[candidates]

    def _embed(self, loaded: _Loaded, images: Sequence[Any]) -> np.ndarray:
        images = list(images)
        for position, image in enumerate(images):
            if isinstance(image, (bytes, bytearray, str)) or image is None:
                raise TypeError(
                    f"image {position} is a {type(image).__name__}, not a decoded image: decode it in the prepare "
                    "stage (resources.multimodal.load_image) and pass PIL images or HxWxC uint8 arrays"
                )
        if loaded.kind == "sentence_transformers":
            return self._encode_st(loaded, [_as_pil(image) for image in images], normalize=self.normalize)
        return self._encode_torch(loaded, images)

    def _encode_st(self, loaded: _Loaded, inputs: list[Any], *, normalize: bool) -> np.ndarray:
        vectors = loaded.model.encode(
            inputs,
            batch_size=self.batch_size,
            normalize_embeddings=normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def _encode_torch(self, loaded: _Loaded, images: list[Any]) -> np.ndarray:
        import torch

        chunks = []
        for start in range(0, len(images), self.batch_size):
            piece = images[start : start + self.batch_size]
            batch = torch.stack([loaded.preprocess(image) for image in piece]).to(loaded.device)
            with torch.inference_mode():
                out = loaded.model(batch)
            if not isinstance(out, torch.Tensor) or out.ndim < 2 or out.shape[0] != len(piece):
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(
                    f"torch_module {self.torch_module!r} returned {shape} for a batch of {len(piece)} images: it "
                    "must return one vector per image, shape (N, D)"
                )
            chunks.append(out.reshape(len(piece), -1).float().cpu().numpy())
        if not chunks:
            return np.zeros((0, 0), dtype=np.float32)
        vectors = np.concatenate(chunks).astype(np.float32, copy=False)
        return _unit(vectors) if self.normalize else vectors


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _as_pil(image: Any) -> Any:
    if hasattr(image, "convert") and hasattr(image, "mode"):
        return image
    from PIL import Image

    return Image.fromarray(to_rgb_array(image))
