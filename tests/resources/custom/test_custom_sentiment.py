"""The review_sentiment example class (batch_assets/examples/sentiment.py) run through CustomModelProvider with MiniLM."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from batch_assets.resources.custom import CustomModelProvider

REPO_ROOT = Path(__file__).resolve().parents[3]

REVIEWS = [
    ("This product is amazing, it exceeded all my expectations", "positive"),
    ("Absolutely love it, works perfectly every day", "positive"),
    ("Great quality and fast delivery, very happy", "positive"),
    ("Best purchase I made this year, highly recommend", "positive"),
    ("Worst purchase I've ever made, it broke after one day", "negative"),
    ("Terrible quality, a complete waste of money", "negative"),
    ("Awful, it stopped working and support never answered", "negative"),
    ("I hate this thing, returning it for a refund", "negative"),
]


@pytest.fixture(scope="module")
def sentiment() -> CustomModelProvider:
    # batch_assets.examples lives at the repository root; until it is listed in pyproject's packages it is importable
    # only with the root on sys.path (a worker image would install it like any user package).
    added = importlib.util.find_spec("batch_assets.examples") is None
    if added:
        sys.path.insert(0, str(REPO_ROOT))
    provider = CustomModelProvider(
        class_path="batch_assets.examples.sentiment:ReviewSentiment",
        init_kwargs={"text_column": "review"},
        batch_size=3,
    ).load_for_tests()
    yield provider
    if added:
        sys.path.remove(str(REPO_ROOT))


def test_sentiment_has_one_label_and_score_per_review(sentiment):
    texts = [text for text, _ in REVIEWS]
    out = sentiment.predict({"review": texts, "review_id": list(range(len(texts)))})
    assert set(out) == {"sentiment", "score"}
    assert len(out["sentiment"]) == len(out["score"]) == len(texts)
    assert set(out["sentiment"]) <= {"positive", "negative"}
    assert all(0.0 <= s <= 1.0 for s in out["score"])
    right = sum(got == want for got, (_, want) in zip(out["sentiment"], REVIEWS))
    assert right >= 7, list(zip(out["sentiment"], REVIEWS))
    # the score is P(positive): above one half exactly when the label is positive
    assert all((s > 0.5) == (label == "positive") for s, label in zip(out["score"], out["sentiment"]))


def test_the_device_reaches_the_class(sentiment):
    assert str(sentiment.instance.model.device) == "cpu"


def test_a_missing_text_column_is_named(sentiment):
    with pytest.raises(Exception, match="reads column 'review'"):
        sentiment.predict({"text": ["fine"]})


def test_review_sentiment_pipeline_end_to_end(sentiment, tmp_path):
    """The example class as a pipeline's model: predict task, custom provider, one partition, every row out once."""
    from batch_assets.spec import parse_spec
    from batch_assets.resources.base import LOAD_COUNTS
    from tests.conftest import read_output, run_pipeline, write_jsonl

    rows = [{"review_id": f"r{i}", "review_text": text} for i, (text, _) in enumerate(REVIEWS)]
    rows.append({"review_id": "r-empty", "review_text": "  "})
    write_jsonl(tmp_path / "data" / "week1.jsonl", rows)
    spec = parse_spec(
        {
            "name": "review_sentiment",
            "source": {"format": "jsonl", "path": f"{tmp_path}/data/{{partition}}.jsonl",
                       "columns": ["review_id", "review_text"]},
            "partitioning": {"kind": "static", "keys": ["week1"]},
            "prepare": {"id_column": "review_id", "input_columns": ["review_text"]},
            "task": {"kind": "predict"},
            "model": {
                "provider": "custom",
                "config": {
                    "class_path": "batch_assets.examples.sentiment:ReviewSentiment",
                    "init_kwargs": {"text_column": "review_text"},
                    "batch_size": 4,
                },
            },
            "runtime": {"chunk_rows": 5},
        }
    )
    before = LOAD_COUNTS["CustomModelProvider"]
    result = run_pipeline(spec, tmp_path / "store", ["week1"])
    assert result.success
    assert LOAD_COUNTS["CustomModelProvider"] == before + 1  # once for the run, not per chunk
    table = read_output(spec, tmp_path / "store", "week1").to_pylist()
    by_id = {r["review_id"]: r for r in table}
    assert sorted(by_id) == sorted(r["review_id"] for r in rows) and len(table) == len(rows)
    right = sum(by_id[f"r{i}"]["sentiment"] == want for i, (_, want) in enumerate(REVIEWS))
    assert right >= 7
    # predict hands every row to the class (blank values included: the class decides what they mean)
    assert by_id["r-empty"]["sentiment"] in {"positive", "negative"}
    assert all(0.0 <= r["score"] <= 1.0 for r in table)
