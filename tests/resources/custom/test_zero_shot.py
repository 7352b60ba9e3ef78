"""ZeroShotEmbeddingClassifier: topic labels by MiniLM similarity, on texts where the answer is obvious."""

from __future__ import annotations

import pytest

from batch_assets.resources.custom import ZeroShotEmbeddingClassifier
from batch_assets.resources.protocols import TextClassifier

TEXTS = [
    ("The striker scored twice and the team won the championship final", "sports"),
    ("She served an ace and took the tennis match in straight sets", "sports"),
    ("The goalkeeper saved a penalty in the last minute of the game", "sports"),
    ("The marathon runners crossed the finish line after three hours", "sports"),
    ("Simmer the tomato sauce with garlic and basil for twenty minutes", "cooking"),
    ("Knead the bread dough, let it rise, then bake it in a hot oven", "cooking"),
    ("Whisk the eggs with sugar and fold in the flour for the sponge cake", "cooking"),
    ("Season the steak with salt and pepper and sear it in a hot pan", "cooking"),
]


@pytest.fixture(scope="module")
def classifier() -> ZeroShotEmbeddingClassifier:
    return ZeroShotEmbeddingClassifier(batch_size=16).load_for_tests()


def test_is_a_text_classifier(classifier):
    assert isinstance(classifier, TextClassifier)


def test_obvious_topics_are_mostly_right_with_softmax_scores(classifier):
    out = classifier.classify([t for t, _ in TEXTS], ["sports", "cooking"])
    assert len(out) == len(TEXTS)
    assert all(c.label in {"sports", "cooking"} and c.error is None for c in out)
    right = sum(c.label == want for c, (_, want) in zip(out, TEXTS))
    assert right >= 7, [(c.label, t) for c, (t, _) in zip(out, TEXTS)]
    assert all(0.5 <= c.score <= 1.0 for c in out)  # two labels: the winner's probability is at least one half


def test_label_descriptions_make_opaque_label_names_work(classifier):
    described = ZeroShotEmbeddingClassifier(
        label_descriptions={"A": "sports: football, tennis, matches, athletes", "B": "cooking: recipes, food, baking"},
        score="cosine",
    )
    described._model = classifier.loaded  # same MiniLM already in memory: no second load
    out = described.classify([t for t, _ in TEXTS], ["A", "B"])
    names = {"A": "sports", "B": "cooking"}
    right = sum(names[c.label] == want for c, (_, want) in zip(out, TEXTS))
    assert right >= 7
    assert all(-1.0 <= c.score <= 1.0 for c in out)


def test_empty_rows_get_an_error_and_keep_their_place(classifier):
    out = classifier.classify(["", TEXTS[0][0], None], ["sports", "cooking"])
    assert [c.label for c in out] == [None, "sports", None]
    assert out[0].error and out[2].error


def test_labels_must_be_given_and_distinct(classifier):
    with pytest.raises(ValueError, match="at least one candidate label"):
        classifier.classify(["x"], [])
    with pytest.raises(ValueError, match="repeat"):
        classifier.classify(["x"], ["a", "a"])


def test_template_must_mention_the_label():
    with pytest.raises(ValueError, match="must contain"):
        ZeroShotEmbeddingClassifier(hypothesis_template="This text is about something.")
