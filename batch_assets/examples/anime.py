"""The return format of the `quote_classification` example (Daft's `prompt(..., return_format=Anime)` seed).

Each field has a length cap: the constrained decoder closes a string at its cap, so the JSON always completes
within the spec's max_new_tokens. Without caps SmolLM2 looped inside `explanation` on 2 of the 8 sample quotes
until the token budget ran out, and every shipped sensor run failed its blocking error_rate check.
"""

from pydantic import BaseModel, Field


class Anime(BaseModel):
    show: str = Field(description="The name of the anime show", max_length=60)
    character: str = Field(description="The name of the character", max_length=60)
    explanation: str = Field(description="Why the character says the quote", max_length=160)
