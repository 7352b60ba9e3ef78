"""The return format of the `quote_classification` example (Daft's `prompt(..., return_format=Anime)` seed)."""

from pydantic import BaseModel, Field


class Anime(BaseModel):
    show: str = Field(description="The name of the anime show")
    character: str = Field(description="The name of the character")
    explanation: str = Field(description="Why the character says the quote")
