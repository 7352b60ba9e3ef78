"""Capability protocols every model provider implements.

A pipeline's infer stage only ever talks to these: swapping sentence-transformers for an OpenAI-compatible
endpoint, or transformers for vLLM, is a configuration change, not a code change. Each method takes a whole chunk
of rows (hundreds, not one) so providers can batch, sort by length and keep accelerators busy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

import numpy as np

# One chat message: {"role": "system" | "user" | "assistant", "content": str | list[content part]}.
Message = dict[str, Any]
Conversation = list[Message]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling and output constraints for one generate call (the same for every row of the call)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Structured output: at most one of these is set. Providers that cannot enforce a constraint must say so
    # with an error, never ignore it silently.
    choices: tuple[str, ...] | None = None
    regex: str | None = None
    json_schema: dict[str, Any] | None = None
    # Provider-specific pass-through (e.g. OpenAI `extra_body` for vLLM guided decoding).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generation:
    """The outcome for one row. `error` is set (and `text` may hold the raw output) when the row failed."""

    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    parsed: Any = None  # the validated structured value, when params asked for one
    # Why generation stopped, where the provider knows: "length" (hit max_new_tokens), "stop" (the model ended it or
    # a stop string). None: not reported. Structured-output errors say "cut off" only for "length".
    finish_reason: str | None = None


@dataclass
class Classification:
    label: str | None
    score: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class AudioFile:
    """One audio file to transcribe: `name` is its path or URL (for messages), `open` gives a binary file object to
    read it from. The caller opens nothing: a provider opens each file when it gets to it and streams it, so a chunk
    of hour-long recordings is never in memory at once."""

    name: str
    open: Callable[[], IO[bytes]]


@dataclass(frozen=True)
class TranscriptSegment:
    start: float  # seconds from the start of the file
    end: float
    text: str


@dataclass
class Transcription:
    """The outcome for one audio file. `error` is set (naming the file) when it could not be read or decoded."""

    text: str | None
    language: str | None = None
    duration_s: float | None = None
    segments: list[TranscriptSegment] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class BatchState:
    """A provider-side batch as the batch machinery sees it (batch_assets/stages/infer_batch.py), whatever the
    provider family: its own status word, whether it has ended, its counts, and where its results are."""

    id: str
    status: str  # the provider's word (OpenAI: validating, in_progress, finalizing, completed, expired, ...)
    ended: bool  # no further change: its results (if any) can be read
    total: int = 0
    completed: int = 0
    failed: int = 0
    failure: str | None = None  # the whole batch was refused (validation): why
    retry_later: bool = False  # ... for a reason that passes (a queue limit): its rows go into a later batch
    files: tuple[str, ...] = ()  # where its results are (OpenAI: output and error file ids)


@dataclass(frozen=True)
class BatchOutcome:
    """One request's result read back from a batch: an answer, or an error that is `retryable` (a 5xx, 429: the
    online path's transient class) or not (a 4xx refusal: a row error); `unfinished`: it never ran (the batch
    expired or was cancelled first)."""

    answer: Any = None  # a Generation (generate) or a float32 vector (embed)
    error: str | None = None
    retryable: bool = False
    unfinished: bool = False
    prompt_tokens: int | None = None  # usage of an answer that carries none itself (an embedding)


@runtime_checkable
class TextEmbedder(Protocol):
    """Turns texts into fixed-size float32 vectors: returns an array of shape (len(texts), dimensions)."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class TextGenerator(Protocol):
    """Generates one completion per conversation, in the order given."""

    def generate(self, conversations: Sequence[Conversation], params: GenerationParams) -> list[Generation]: ...


@runtime_checkable
class TextClassifier(Protocol):
    """Assigns one of `labels` to each text, in the order given."""

    def classify(self, texts: Sequence[str], labels: Sequence[str]) -> list[Classification]: ...


@runtime_checkable
class BatchPredictor(Protocol):
    """A user model in the `@daft.cls` / Ray `map_batches` shape: one call per batch of rows.

    `batch` maps each input column name to a list of that column's values. The return value is either a list
    (one output column) or a dict of lists (several output columns); every list must have len(batch rows).
    """

    def predict(self, batch: dict[str, list[Any]]) -> list[Any] | dict[str, list[Any]]: ...


@runtime_checkable
class ImageEmbedder(Protocol):
    """Turns images (PIL.Image) into fixed-size float32 vectors, shape (len(images), dimensions)."""

    def embed_images(self, images: Sequence[Any]) -> np.ndarray: ...


@runtime_checkable
class ImageClassifier(Protocol):
    """Assigns one of `labels` to each image (PIL.Image), in the order given."""

    def classify_images(self, images: Sequence[Any], labels: Sequence[str]) -> list[Classification]: ...


@runtime_checkable
class Transcriber(Protocol):
    """Speech to text, one Transcription per file, in the order given; a file that cannot be read is that row's
    error, never the call's."""

    def transcribe(self, audio: Sequence[AudioFile]) -> list[Transcription]: ...


@runtime_checkable
class InputTokens(Protocol):
    """Optional, for `prepare.max_input_tokens`: the tokenizer that counts this model's input tokens (a Hugging Face
    tokenizer) and the longest input it takes, in tokens of the text alone (None when unknown); `system` is the
    pipeline's system message, which a chat template adds to every prompt (resources/tokens.py). ModelResource
    declares both, answering None (no tokenizer: the spec's limit is refused with the fix); a provider that can
    count overrides them."""

    def input_tokenizer(self) -> Any: ...

    def max_input_tokens(self, params: GenerationParams | None, system: str | None) -> int | None: ...


# task kind in a pipeline spec -> (protocol, the method a provider must have)
CAPABILITIES: dict[str, tuple[type, str]] = {
    "embed": (TextEmbedder, "embed"),
    "generate": (TextGenerator, "generate"),
    "classify": (TextClassifier, "classify"),
    "predict": (BatchPredictor, "predict"),
    "embed_image": (ImageEmbedder, "embed_images"),
    "classify_image": (ImageClassifier, "classify_images"),
    "transcribe": (Transcriber, "transcribe"),
}


def supports(provider_cls: type, task: str) -> bool:
    """Whether a provider class implements the capability a task needs (checked at definition load)."""
    entry = CAPABILITIES.get(task)
    return entry is not None and callable(getattr(provider_cls, entry[1], None))
