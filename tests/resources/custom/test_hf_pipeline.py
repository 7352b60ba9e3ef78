"""HFPipelineProvider over tiny, randomly initialised BERT classifiers saved to a temporary folder.

No classification checkpoint ships offline, so these check the plumbing (loading by path, one label per row from
the model's id2label, label mapping, zero-shot NLI wiring), not accuracy: a random model's choices are arbitrary.
"""

from __future__ import annotations

import pytest
import transformers

from batch_assets.resources.custom import HFPipelineProvider
from batch_assets.resources.provider_errors import ModelLoadError
from batch_assets.resources.protocols import BatchPredictor, TextClassifier


WORDS = "the a team won match game goal soup recipe bake oven bread".split()
TEXTS = ["the team won the match", "bake the bread in the oven", "a goal", "soup recipe"]


def save_tiny_classifier(folder, labels: list[str]) -> str:
    import torch

    torch.manual_seed(0)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = transformers.BertTokenizer(str(vocab))
    config = transformers.BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    model_dir = folder / "model"
    transformers.BertForSequenceClassification(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return str(model_dir)


@pytest.fixture(scope="module")
def topic_model(tmp_path_factory) -> str:
    return save_tiny_classifier(tmp_path_factory.mktemp("tiny_bert"), ["sports", "cooking", "other"])


@pytest.fixture(scope="module")
def nli_model(tmp_path_factory) -> str:
    return save_tiny_classifier(tmp_path_factory.mktemp("tiny_nli"), ["contradiction", "neutral", "entailment"])


@pytest.fixture(scope="module")
def topics(topic_model) -> HFPipelineProvider:
    return HFPipelineProvider(model=topic_model, batch_size=2).load_for_tests()


def test_implements_classify_and_predict(topics):
    assert isinstance(topics, TextClassifier) and isinstance(topics, BatchPredictor)


def test_one_label_per_row_from_the_models_id2label(topics):
    out = topics.classify(TEXTS, ["sports", "cooking", "other"])
    assert len(out) == len(TEXTS)
    assert all(c.label in {"sports", "cooking", "other"} and 0.0 <= c.score <= 1.0 for c in out)


def test_candidate_labels_restrict_the_models_labels(topics):
    out = topics.classify(TEXTS, ["cooking"])
    assert [c.label for c in out] == ["cooking"] * len(TEXTS)


def test_labels_the_model_does_not_have_are_refused_with_its_labels_listed(topics):
    with pytest.raises(ValueError, match=r"whose labels are \['sports', 'cooking', 'other'\]"):
        topics.classify(TEXTS, ["positive", "negative"])


def test_label_map_renames_model_labels(topic_model):
    provider = HFPipelineProvider(model=topic_model, label_map={"sports": "sport", "cooking": "food"})
    provider.load_for_tests()
    out = provider.predict({"text": TEXTS})
    assert set(out) == {"label", "score", "error"}
    assert len(out["label"]) == len(TEXTS)
    assert set(out["label"]) <= {"sport", "food", "other"}


def test_empty_texts_are_row_errors(topics):
    out = topics.classify(["", TEXTS[0], None], ["sports", "cooking", "other"])
    assert out[0].label is None and out[0].error
    assert out[1].label is not None
    assert out[2].label is None and out[2].error


def test_zero_shot_nli_model_picks_one_of_the_candidates(nli_model):
    provider = HFPipelineProvider(
        model=nli_model, task="zero-shot-classification", candidate_labels=["sports", "cooking"]
    ).load_for_tests()
    out = provider.predict({"body": TEXTS})  # a single input column is used whatever its name
    assert len(out["label"]) == len(TEXTS)
    assert set(out["label"]) <= {"sports", "cooking"}
    assert all(0.0 <= s <= 1.0 for s in out["score"])


def test_a_folder_without_a_model_fails_the_load_with_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json: point `model` at a folder written by"):
        HFPipelineProvider(model=str(tmp_path)).load_for_tests()
    with pytest.raises(ModelLoadError, match="does not exist"):
        HFPipelineProvider(model=str(tmp_path / "missing")).load_for_tests()
