"""ImageModelProvider with models built inside the test (no image model ships offline):

- a tiny conv net given by import path (`torch_module`), classifying by label prototypes from example images;
- a tiny randomly initialised CLIP saved as a sentence-transformers folder (`model`), exercising the real CLIP
  path: image and text towers, label prompts, similarity. Random weights: these check shapes and plumbing, not
  accuracy.
"""

from __future__ import annotations

import sys
import textwrap
import uuid

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from batch_assets.resources.protocols import ImageClassifier, ImageEmbedder, TextEmbedder
from batch_assets.resources.vision import ImageModelProvider

TINY_NET = textwrap.dedent(
    '''
    import torch
    from torch import nn


    def build(dim=8, seed=0):
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=3, stride=2),
            nn.Tanh(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(6, dim),
        )


    def not_a_module():
        return "weights.pt"


    def half_size(image):
        import numpy as np
        array = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.float32) / 255.0
        return torch.from_numpy(array).permute(2, 0, 1)[:, ::2, ::2].contiguous()
    '''
)


@pytest.fixture(scope="module")
def net_module(tmp_path_factory):
    name = f"user_vision_{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("user_vision")
    (folder / f"{name}.py").write_text(TINY_NET)
    sys.path.insert(0, str(folder))
    yield name
    sys.path.remove(str(folder))
    sys.modules.pop(name, None)


def solid(color, size=(48, 40), noise=0, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    array = np.empty((size[1], size[0], 3), dtype=np.int16)
    array[:] = color
    array += rng.integers(-noise, noise + 1, size=array.shape, dtype=np.int16) if noise else 0
    return np.clip(array, 0, 255).astype(np.uint8)


RED, BLUE = (220, 20, 20), (20, 40, 220)


def test_torch_module_embeds_numpy_images_without_pillow(net_module):
    provider = ImageModelProvider(torch_module=f"{net_module}:build", image_size=32, batch_size=3).load_for_tests()
    assert isinstance(provider, ImageEmbedder)
    vectors = provider.embed_images([solid(RED), solid(BLUE), solid(RED, (10, 90)), solid((0, 0, 0)), solid(BLUE)])
    assert vectors.shape == (5, 8) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[1], vectors[4], atol=1e-5)  # same picture, same vector, across batch boundaries


def test_torch_module_kwargs_and_custom_preprocess(net_module):
    provider = ImageModelProvider(
        torch_module=f"{net_module}:build",
        torch_module_kwargs={"dim": 4},
        preprocess=f"{net_module}:half_size",
        normalize=False,
    ).load_for_tests()
    assert provider.embed_images([solid(RED), solid(BLUE)]).shape == (2, 4)


def test_torch_module_classifies_by_label_prototypes(net_module, tmp_path):
    examples = {}
    for label, color in (("red", RED), ("blue", BLUE)):
        paths = []
        for seed in range(2):
            path = tmp_path / f"{label}{seed}.png"
            Image.fromarray(solid(color, noise=10, seed=seed)).save(path)
            paths.append(str(path))
        examples[label] = paths
    provider = ImageModelProvider(
        torch_module=f"{net_module}:build", image_size=32, label_examples=examples
    ).load_for_tests()
    assert isinstance(provider, ImageClassifier)
    queries = [solid(RED, noise=10, seed=5), solid(BLUE, noise=10, seed=6), None, Image.fromarray(solid(RED))]
    out = provider.classify_images(queries, ["red", "blue"])
    assert [c.label for c in out] == ["red", "blue", None, "red"]
    assert out[2].error == "no image"
    assert all(0.5 <= c.score <= 1.0 for c in out if c.label)
    with pytest.raises(ValueError, match=r"labels \['green'\] have no label_examples"):
        provider.classify_images(queries[:1], ["red", "green"])


def test_torch_module_without_examples_has_no_text_side(net_module):
    provider = ImageModelProvider(torch_module=f"{net_module}:build", image_size=32).load_for_tests()
    with pytest.raises(ValueError, match="no text side .* set label_examples"):
        provider.classify_images([solid(RED)], ["red", "blue"])
    with pytest.raises(TypeError, match="has no text side"):
        provider.embed(["red"])


def test_undecoded_images_are_refused_with_a_pointer_to_the_prepare_stage(net_module):
    provider = ImageModelProvider(torch_module=f"{net_module}:build", image_size=32).load_for_tests()
    with pytest.raises(TypeError, match="decode it in the prepare stage"):
        provider.embed_images(["s3://bucket/cat.jpg"])


def test_factory_must_build_a_torch_module(net_module):
    from batch_assets.resources.custom.loading import ImportPathError

    with pytest.raises(ImportPathError, match="returned a str, not a torch.nn.Module"):
        ImageModelProvider(torch_module=f"{net_module}:not_a_module").load_for_tests()


def test_exactly_one_backend():
    with pytest.raises(ValueError, match="exactly one of `model`"):
        ImageModelProvider()
    with pytest.raises(ValueError, match="exactly one of `model`"):
        ImageModelProvider(model="clip", torch_module="m:f")


@pytest.fixture(scope="module")
def tiny_clip_folder(tmp_path_factory) -> str:
    """A random CLIP with 8-dim projections, saved as transformers + processor files: sentence-transformers
    recognises the CLIP architecture and gives it an image and a text side."""
    torch.manual_seed(0)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for ch in "abcdefghijklmnopqrstuvwxyz.":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[])
    config = transformers.CLIPConfig(
        text_config={
            "vocab_size": len(vocab), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 1,
            "pad_token_id": 1,
        },
        vision_config={
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": 32, "patch_size": 8,
        },
        projection_dim=8,
    )
    processor = transformers.CLIPProcessor(
        image_processor=transformers.CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        tokenizer=tokenizer,
    )
    folder = tmp_path_factory.mktemp("tiny_clip")
    transformers.CLIPModel(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def test_clip_through_sentence_transformers(tiny_clip_folder):
    from PIL import Image

    provider = ImageModelProvider(model=tiny_clip_folder, batch_size=2).load_for_tests()
    assert isinstance(provider, TextEmbedder)
    images = [Image.fromarray(solid(RED)), solid(BLUE), Image.fromarray(solid((0, 200, 0), (20, 70)))]
    image_vectors = provider.embed_images(images)
    text_vectors = provider.embed(["a photo of a cat.", "a photo of a dog."])
    assert image_vectors.shape == (3, 8) and text_vectors.shape == (2, 8)
    out = provider.classify_images(images, ["cat", "dog", "car"])
    assert len(out) == 3 and all(c.label in {"cat", "dog", "car"} for c in out)
    assert all(1 / 3 <= c.score <= 1.0 for c in out)
    # the label a row gets is the label prompt its image vector is closest to
    prompts = provider.embed(["a photo of a cat.", "a photo of a dog.", "a photo of a car."])
    expected = (image_vectors @ prompts.T).argmax(axis=1)
    assert [c.label for c in out] == [["cat", "dog", "car"][i] for i in expected]
