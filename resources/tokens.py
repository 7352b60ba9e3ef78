"""What a provider tells the infer loop about input length: its tokenizer and the longest input its model takes.

The optional `InputTokens` capability (resources/protocols.py) behind `prepare.max_input_tokens`
(batch_assets/tasks/token_limits.py). Limits are in tokens of the input text alone: special tokens a model adds, and for
generation the chat template, the system message and `max_new_tokens`, are taken off the model's length here.
"""

from __future__ import annotations

from typing import Any

from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.hf.models import MINILM, SMOLLM2, minilm_path, smollm2_location
from batch_assets.resources.protocols import GenerationParams

# transformers' "no limit" sentinel for model_max_length is a huge number (int(1e30)), not None.
_NO_LIMIT = 10**7


def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer by the names model configs use: the two shipped model aliases, a local folder, or
    a Hub id available offline."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # an API-only install counts tokens only when a spec asks for a limit
        raise MissingExtraError("transformers", "local", f"the tokenizer {name!r} (a token limit on the input)") from exc
    if name == MINILM:
        return AutoTokenizer.from_pretrained(minilm_path())
    if name == SMOLLM2:
        folder, gguf = smollm2_location()
        return AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    return AutoTokenizer.from_pretrained(name)


def encoder_limit(tokenizer: Any, model_length: int | None) -> int | None:
    """Longest text an encoder (embedding / classification model) takes, special tokens excluded."""
    if model_length is None or model_length >= _NO_LIMIT:
        return None
    return int(model_length) - int(tokenizer.num_special_tokens_to_add(pair=False))


def generation_limit(tokenizer: Any, context_length: int | None, params: GenerationParams | None,
                     system: str | None) -> int | None:
    """Longest user prompt a generator takes: its context less the chat template around the prompt (with the
    system message) and the tokens it may generate."""
    if context_length is None or context_length >= _NO_LIMIT:
        return None
    if params is None:  # an embedding call on a generative provider
        return encoder_limit(tokenizer, context_length)
    overhead = 0
    if getattr(tokenizer, "chat_template", None):
        conversation = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": ""}]
        rendered = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        overhead = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return int(context_length) - params.max_new_tokens - overhead
