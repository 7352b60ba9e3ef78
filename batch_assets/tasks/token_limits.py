"""Inputs longer than the model takes (`prepare.max_input_tokens`, `prepare.too_long`).

Without a limit a model does what it does with a long input: sentence-transformers cuts it at its max_seq_length
without a word, an HTTP endpoint answers 400 (a row error), a local generator refuses it (a row error). With a limit,
inputs are counted in the model's own tokens (the provider's tokenizer, `InputTokens` in resources/protocols.py)
and each one over the limit is, as the spec says:
- `truncate`: cut to its first `max_input_tokens` tokens (an exact prefix of the text, from the tokenizer's offsets),
  sent, and flagged `input_truncated = true` in the output, so a user can find and count them;
- `skip`: not sent; the row keeps an `error` ("input too long: ...") and goes to the dead letters;
- `fail`: the step fails before any model call, naming the first row over the limit (a pass over the partition's
  prepared rows counts every input first).

Counting uses a private copy of the tokenizer's Rust backend (the `tokenizers` library, which every transformers 5
tokenizer runs on) with truncation and padding off: transformers leaves the truncation settings of its last call on
the shared backend, which would cap every count at the model's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.storage import read_batches
from batch_assets.resources.protocols import GenerationParams

class TokenCounter:
    """Counts and cuts texts in a model's tokens."""

    def __init__(self, tokenizer: Any):
        from tokenizers import Tokenizer

        backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise PipelineError(
                f"the model's tokenizer ({type(tokenizer).__name__}) is not a fast (Rust) tokenizer, which "
                "prepare.max_input_tokens needs to count and cut inputs",
                fix="use a model with a fast tokenizer (tokenizer.json), or drop prepare.max_input_tokens",
            )
        self._tok = Tokenizer.from_str(backend.to_str())
        self._tok.no_truncation()
        self._tok.no_padding()

    def encode(self, texts: list[str]) -> list[Any]:
        """One `tokenizers.Encoding` per text (ids and character offsets)."""
        return self._tok.encode_batch(texts, add_special_tokens=False) if texts else []

    def lengths(self, texts: list[str], encodings: list[Any] | None = None) -> np.ndarray:
        encodings = self.encode(texts) if encodings is None else encodings
        return np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))

    def cut(self, text: str, limit: int, offsets: list[tuple[int, int]] | None = None) -> str:
        """The longest prefix of `text` ending on a token boundary that is at most `limit` tokens (`offsets`: the
        text's encoding offsets when the caller already has them)."""
        if offsets is None:
            offsets = self._tok.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= limit:
            return text
        keep = limit
        while keep > 0:
            prefix = text[: offsets[keep - 1][1]]
            # A prefix cut inside a word can tokenize into more pieces than it had inside the word: step back.
            if len(self._tok.encode(prefix, add_special_tokens=False).ids) <= limit:
                return prefix
            keep -= 1
        return ""


@dataclass
class TokenLimit:
    """The limit in force for one run of one pipeline (None from `for_run` when the spec sets none) on the prepared
    text `column`, which messages call `user_column` (the task says which: batch_assets/tasks)."""

    spec: Any  # the parsed PipelineSpec (the spec imports the task table, which builds limits)
    counter: TokenCounter
    max_tokens: int
    mode: str  # truncate | skip | fail
    column: str
    user_column: str

    @classmethod
    def for_run(cls, spec: Any, provider: Any, params: GenerationParams | None, column: str,
                user_column: str) -> TokenLimit | None:
        wanted = spec.prepare.max_input_tokens
        if wanted is None:
            return None
        name = f"{type(provider).__name__} (model {provider.model_name()!r})"
        tokenizer = provider.input_tokenizer()
        if tokenizer is None:
            raise PipelineError(
                f"prepare.max_input_tokens is set but {name} has no tokenizer to count input tokens with",
                pipeline=spec.name,
                fix="for an HTTP endpoint set model.config.tokenizer to the served model's tokenizer (a local folder "
                "or an offline Hub id); for a custom model class define input_tokenizer(); or drop "
                "prepare.max_input_tokens",
            )
        model_limit = provider.max_input_tokens(params, spec.prepare.system)
        if wanted == "model":
            if model_limit is None:
                raise PipelineError(
                    f"prepare.max_input_tokens is 'model' but {name} does not know its longest input",
                    pipeline=spec.name,
                    fix="set prepare.max_input_tokens to a number (for an HTTP endpoint, or set "
                    "model.config.context_length)",
                )
            wanted = model_limit
        return cls(spec, TokenCounter(tokenizer), int(wanted), spec.prepare.too_long, column, user_column)

    def apply(self, texts: list[str], sent: np.ndarray, errors: list[str | None], n: int,
              ) -> tuple[list[str], np.ndarray, list[bool] | None]:
        """Texts of the sent rows in; the texts to send, the rows to send, and the `input_truncated` flags (one per
        row of the chunk; None unless truncating). `skip` writes row errors into `errors`."""
        if self.mode == "fail":  # every input of the partition was counted before any model call (check_partition)
            return texts, sent, None
        encodings = self.counter.encode(texts)
        lengths = self.counter.lengths(texts, encodings)
        over = np.flatnonzero(lengths > self.max_tokens)
        flags: list[bool] | None = [False] * n if self.mode == "truncate" else None
        if not len(over):
            return texts, sent, flags
        if self.mode == "truncate":
            texts = list(texts)
            for j in over.tolist():
                texts[j] = self.counter.cut(texts[j], self.max_tokens, encodings[j].offsets)
                flags[int(sent[j])] = True  # type: ignore[index]
            return texts, sent, flags
        keep = np.ones(len(texts), dtype=bool)  # skip
        keep[over] = False
        for j in over.tolist():
            errors[int(sent[j])] = (f"input too long: {int(lengths[j])} tokens, over prepare.max_input_tokens="
                                    f"{self.max_tokens}; not sent to the model")
        return [t for t, k in zip(texts, keep.tolist()) if k], sent[keep], flags

    def check_partition(self, src: str, partition: str, batch_rows: int) -> None:
        """`fail` mode: one pass over the prepared rows before any model call; the first input over the limit
        fails the step with its row id, length and the fix."""
        column = self.column
        for batch in read_batches(src, columns=["row_id", "_input_empty", column], batch_rows=batch_rows):
            empty = batch.column("_input_empty").to_numpy(zero_copy_only=False)
            rows = np.flatnonzero(~empty)
            if not len(rows):
                continue
            texts = batch.column(column).take(pa.array(rows)).to_pylist()
            lengths = self.counter.lengths(texts)
            over = np.flatnonzero(lengths > self.max_tokens)
            if len(over):
                first = int(rows[over[0]])
                raise PipelineError(
                    f"an input is {int(lengths[over[0]])} tokens long, over prepare.max_input_tokens="
                    f"{self.max_tokens} (prepare.too_long: fail); no row of the partition was sent to the model",
                    pipeline=self.spec.name,
                    partition=partition,
                    column=self.user_column,
                    row=str(batch.column("row_id")[first].as_py()),
                    fix="shorten that input, raise prepare.max_input_tokens, or set prepare.too_long to 'truncate' "
                    "(cut and flag in input_truncated) or 'skip' (a row error, kept in the dead letters)",
                )
