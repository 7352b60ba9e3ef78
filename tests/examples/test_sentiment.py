"""The review_sentiment example's model class (batch_assets/examples/sentiment.py), with the real MiniLM model from
its pip package: plainly worded reviews get the side they are on, one label and one score per review in order, the
score agreeing with the label; an empty review still gets an answer; a batch without the configured text column
fails naming the column and the columns it has."""

from __future__ import annotations

import pytest

from batch_assets.examples.sentiment import ReviewSentiment

POSITIVE = ["I love this blender, it works perfectly.", "Great headphones, excellent sound and very comfortable."]
NEGATIVE = ["Terrible kettle, it broke after two days.", "Awful customer service, I want my money back."]


@pytest.fixture(scope="module")
def model() -> ReviewSentiment:
    return ReviewSentiment(text_column="review", device="cpu")


def test_plain_reviews_get_their_side_with_a_score_that_agrees(model: ReviewSentiment) -> None:
    reviews = [POSITIVE[0], NEGATIVE[0], POSITIVE[1], NEGATIVE[1], None]
    out = model({"review": reviews})
    assert out["sentiment"][:4] == ["positive", "negative", "positive", "negative"]
    assert len(out["sentiment"]) == len(out["score"]) == 5, "one answer per row, the empty review included"
    for label, score in zip(out["sentiment"], out["score"]):
        assert 0.0 <= score <= 1.0 and (score > 0.5) == (label == "positive")


def test_a_batch_without_the_text_column_names_it(model: ReviewSentiment) -> None:
    with pytest.raises(KeyError, match=r"reads column 'review'; the batch has \['body', 'id'\]"):
        model({"id": [1], "body": ["fine"]})
