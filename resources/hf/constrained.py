"""Constrained decoding for `TransformersGenerator`: choices, regex and JSON schema enforced token by token.

All three kinds go through xgrammar (the grammar engine vLLM uses by default), on CPU or GPU: the constraint is
compiled once per call against the model's tokenizer, every row gets a `GrammarMatcher`, and before each decoding
step a logits processor masks the tokens the grammar does not allow. `choices` is a grammar `"a" | "b" | ...`:
greedy decoding then takes the most likely label token by token (as vLLM's `choice` does), which is not the same
as scoring each whole label's likelihood, but it always yields exactly one of the labels.

Every row's text is then checked with `batch_assets.resources.structured.validate_output`, the check the pipeline applies to
every provider. A row that ran out of `max_new_tokens` before its grammar was complete (a schema too big for the
budget) gets `Generation.error` with its raw text kept; it never fails the call. A constraint that cannot be
compiled (a regex feature xgrammar lacks, a broken schema) fails the call: every row would fail the same way.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.schema_support import XGRAMMAR, warn_unenforced
from batch_assets.resources.structured import StructuredOutput, validate_output


class ConstrainableGenerator(Protocol):
    """What constrained decoding needs from a generator (resources/hf/generator.py `TransformersGenerator`): the
    loaded model and tokenizer, and its decoding loop taking a per-row `finish` and a logits-processor factory."""

    @property
    def loaded(self) -> Any: ...

    def run(self, conversations: Sequence[Conversation], params: GenerationParams, finish: Any,
            logits_processor: Any) -> list[Generation]: ...


# model -> its GrammarCompiler. The compiler holds the tokenizer's vocabulary tables (built once, ~0.1 s) and a
# cache of compiled grammars, so the same schema is compiled once per process, not once per chunk.
_COMPILERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise ImportError(
            "structured output with the transformers generator needs the 'xgrammar' package, which is not "
            "installed. Install it with: pip install 'xgrammar>=0.2.8'"
        ) from exc
    return xgrammar


def _logits_size(model: Any) -> int:
    """The width of the model's logits, which can exceed the tokenizer's vocabulary (padded embeddings)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def grammar_compiler(loaded: Any) -> Any:
    """The xgrammar compiler for a loaded `TransformersGenerator` model (built on first use)."""
    compiler = _COMPILERS.get(loaded.model)
    if compiler is None:
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(
            loaded.tokenizer, vocab_size=_logits_size(loaded.model), stop_token_ids=sorted(loaded.eos_ids)
        )
        compiler = xgr.GrammarCompiler(info, max_threads=2)
        _COMPILERS[loaded.model] = compiler
    return compiler


def choices_grammar(choices: Sequence[str]) -> str:
    """EBNF accepting exactly one of the labels (JSON string escapes are EBNF string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_constraint(compiler: Any, params: GenerationParams) -> Any:
    """Compile the one constraint `params` carries; a ValueError names what xgrammar could not take."""
    try:
        if params.choices is not None:
            return compiler.compile_grammar(choices_grammar(params.choices))
        if params.regex is not None:
            return compiler.compile_regex(params.regex)
        # Compact JSON (one space after ',' and ':'): free whitespace lets a small model pad with newlines until
        # max_new_tokens. vLLM's provider does the same through `disable_any_whitespace`.
        return compiler.compile_json_schema(json.dumps(params.json_schema), any_whitespace=False)
    except RuntimeError as exc:  # xgrammar reports parse errors as RuntimeError with the C++ location first
        kind = "choices" if params.choices is not None else "regex" if params.regex is not None else "json_schema"
        reason = str(exc).split("] ", 1)[-1].strip()
        raise ValueError(f"the {kind} constraint cannot be compiled for constrained decoding: {reason}") from None


def _grammar_logits_processor(compiled: Any, rows: int, logits_size: int) -> Any:
    """A transformers LogitsProcessor that masks, for each row, the tokens its grammar forbids next.

    Unlike `xgrammar.contrib.hf.LogitsProcessor` it never asserts: a row whose matcher rejects a token (which
    would be an xgrammar bug) is left unconstrained and caught by validation afterwards.
    """
    import torch
    from transformers import LogitsProcessor

    xgr = _xgrammar()

    class GrammarLogitsProcessor(LogitsProcessor):
        def __init__(self) -> None:
            self.matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
            self.bitmask = xgr.allocate_token_bitmask(rows, logits_size)
            self.free = [False] * rows  # rows whose matcher gave up; they are masked no more
            self.started = False

        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            if self.started:  # the token sampled at the previous step is the last column of input_ids
                for i, token in enumerate(input_ids[:, -1].tolist()):
                    matcher = self.matchers[i]
                    if not self.free[i] and not matcher.is_terminated() and not matcher.accept_token(token):
                        self.free[i] = True
            self.started = True
            for i, matcher in enumerate(self.matchers):
                if self.free[i]:
                    self.bitmask[i].fill_(-1)  # all bits set: every token allowed
                elif not matcher.is_terminated():  # finished rows only receive padding from here on
                    matcher.fill_next_token_bitmask(self.bitmask, i)
            if scores.device.type == "cuda":
                xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device))
                return scores
            masked = scores.to("cpu")
            xgr.apply_token_bitmask_inplace(masked, self.bitmask)
            return masked.to(scores.device)

    return GrammarLogitsProcessor()


def generate_constrained(
    generator: ConstrainableGenerator, conversations: Sequence[Conversation], params: GenerationParams
) -> list[Generation]:
    """Generate with the constraint in `params` enforced; one Generation per conversation, in order."""
    structured = StructuredOutput.from_params(params)
    assert structured is not None, "generate_constrained called without a constraint"
    if structured.choices is not None:
        # The grammar may spell a label in many small tokens; a label never needs more tokens than characters,
        # and decoding stops at end-of-sequence once a label is complete, so this budget costs nothing extra.
        longest = max(len(choice) for choice in structured.choices)
        params = dataclasses.replace(params, max_new_tokens=max(params.max_new_tokens, longest + 1))
    loaded = generator.loaded
    warn_unenforced(params.json_schema, XGRAMMAR, who=f"{type(generator).__name__}")
    compiled = compile_constraint(grammar_compiler(loaded), params)
    logits_size = _logits_size(loaded.model)

    def finish(prompt_tokens: int, row: list[int], n: int, text: str) -> Generation:
        ended = n > 0 and row[n - 1] in loaded.eos_ids
        value, problem = validate_output(text, structured)
        error = None
        if problem is not None:
            error = (
                f"stopped at max_new_tokens={params.max_new_tokens} before the {structured.kind} output was "
                f"complete ({problem}); raise max_new_tokens or simplify the schema"
                if not ended
                else problem
            )
        return Generation(text=text, prompt_tokens=prompt_tokens, completion_tokens=n, error=error, parsed=value)

    return generator.run(
        conversations, params, finish, lambda rows: _grammar_logits_processor(compiled, rows, logits_size)
    )
