"""The quote_classification example's return format (batch_assets/examples/anime.py): every field has a length cap
that reaches the constrained decoder through the JSON schema, so a generated answer always closes within the
spec's token budget; an over-long value is refused by the model class itself."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batch_assets.examples.anime import Anime


def test_every_field_is_capped_in_the_schema_the_decoder_gets() -> None:
    schema = Anime.model_json_schema()
    assert set(schema["required"]) == {"show", "character", "explanation"}
    assert {name: field.get("maxLength") for name, field in schema["properties"].items()} == {
        "show": 60, "character": 60, "explanation": 160}


def test_an_over_long_value_is_refused() -> None:
    Anime(show="Naruto", character="Naruto Uzumaki", explanation="He never gives up.")
    with pytest.raises(ValidationError, match="explanation"):
        Anime(show="Naruto", character="Naruto Uzumaki", explanation="because " * 30)
