"""Pure translations between this project's types and vLLM's: sampling params in, RequestOutputs out.

Kept apart from the resource so each step is testable on its own: `sampling_params` (GenerationParams ->
SamplingParams with structured outputs), `prefix_order` (which row goes where in the engine's batch) and
`to_generation` (one RequestOutput -> one validated Generation), and the two engine calls built from them,
`run_chat` and `run_embed`, which the step's process and every replica's worker process (replicas.py) share.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.structured import StructuredOutput, validate_output
from batch_assets.resources.vllm_engine.api import VLLMApi, field_names

# GenerationParams fields the provider sets itself; `extra` may not override them.
_OWNED = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed", "structured_outputs", "guided_decoding"})


def structured_outputs_params(api: VLLMApi, params: GenerationParams, json_any_whitespace: bool = False) -> Any:
    """vLLM's StructuredOutputsParams (GuidedDecodingParams before 0.12) for the constraint, or None."""
    if params.choices is not None:
        kwargs: dict[str, Any] = {"choice": list(params.choices)}
    elif params.regex is not None:
        kwargs = {"regex": params.regex}
    elif params.json_schema is not None:
        kwargs = {"json": params.json_schema}
        # Compact JSON, as in the transformers generator: free whitespace lets a model pad until max_tokens.
        if not json_any_whitespace and "disable_any_whitespace" in field_names(api.StructuredOutputsParams):
            kwargs["disable_any_whitespace"] = True
    else:
        return None
    return api.StructuredOutputsParams(**kwargs)


def sampling_params(api: VLLMApi, params: GenerationParams, json_any_whitespace: bool = False) -> Any:
    """One SamplingParams for every row of the call. `params.extra` adds SamplingParams fields (top_k, min_p,
    repetition_penalty, ...); an unknown or owned key is refused with the list of accepted ones."""
    accepted = field_names(api.SamplingParams)
    bad = sorted(k for k in params.extra if k in _OWNED or k not in accepted)
    if bad:
        raise ValueError(
            f"GenerationParams.extra keys {bad} cannot be passed to vLLM's SamplingParams: they are set from "
            "GenerationParams' own fields or are not SamplingParams fields"
        )
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p if params.temperature > 0 else 1.0,
        "seed": params.seed,
        **params.extra,
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    constraint = structured_outputs_params(api, params, json_any_whitespace)
    if constraint is not None:
        kwargs[api.structured_field] = constraint
    return api.SamplingParams(**kwargs)


def _content_key(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, sort_keys=True)


def prefix_order(conversations: Sequence[Conversation]) -> list[int]:
    """Row indices in the order to hand them to the engine: sorted by their messages, so conversations that share
    a prefix (the same system prompt, the same few-shot turns, the same document) are adjacent and vLLM's prefix
    cache serves them while the shared blocks are still resident. Stable, so equal rows keep their order."""
    keys = [tuple((str(m.get("role", "")), _content_key(m.get("content", ""))) for m in c) for c in conversations]
    return sorted(range(len(conversations)), key=keys.__getitem__)


def to_generation(output: Any, params: GenerationParams, structured: StructuredOutput | None) -> Generation:
    """One vLLM RequestOutput as a Generation; a structured row is validated (error set, raw text kept)."""
    prompt_tokens = len(output.prompt_token_ids) if getattr(output, "prompt_token_ids", None) is not None else None
    if not output.outputs:
        return Generation(text=None, prompt_tokens=prompt_tokens, error="vLLM returned no completion for this row")
    completion = output.outputs[0]
    text = completion.text
    n = len(completion.token_ids) if completion.token_ids is not None else None
    finish = getattr(completion, "finish_reason", None)
    if finish == "abort":
        return Generation(
            text=text, prompt_tokens=prompt_tokens, completion_tokens=n, error="vLLM aborted this request"
        )
    if structured is None:
        return Generation(text=text, prompt_tokens=prompt_tokens, completion_tokens=n)
    value, problem = validate_output(text, structured)
    if problem is not None and finish == "length":
        problem = (
            f"stopped at max_new_tokens={params.max_new_tokens} before the {structured.kind} output was complete "
            f"({problem}); raise max_new_tokens or simplify the schema"
        )
    return Generation(text=text, prompt_tokens=prompt_tokens, completion_tokens=n, error=problem, parsed=value)


def run_chat(engine: Any, api: VLLMApi, conversations: Sequence[Conversation], params: GenerationParams, *,
             json_any_whitespace: bool, lora: tuple[str, int, str] | None,
             chat_template_kwargs: dict[str, Any] | None) -> list[Generation]:
    """One `LLM.chat` call for every row, in prefix order, results mapped back to the caller's order (in the step's
    process, or in a replica's worker process for its share)."""
    structured = StructuredOutput.from_params(params)
    order = prefix_order(conversations)
    outputs = engine.chat(
        [list(conversations[i]) for i in order],
        sampling_params=sampling_params(api, params, json_any_whitespace),
        use_tqdm=False,
        lora_request=api.LoRARequest(*lora) if lora else None,
        chat_template_kwargs=chat_template_kwargs,
    )
    if len(outputs) != len(order):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(order)} conversations")
    results: list[Generation | None] = [None] * len(conversations)
    for output, row in zip(outputs, order):
        results[row] = to_generation(output, params, structured)
    return [r for r in results if r is not None]


def run_embed(engine: Any, api: VLLMApi, texts: list[str], lora: tuple[str, int, str] | None) -> np.ndarray:
    outputs = engine.embed(texts, use_tqdm=False, lora_request=api.LoRARequest(*lora) if lora else None)
    if len(outputs) != len(texts):
        raise RuntimeError(f"vLLM returned {len(outputs)} embeddings for {len(texts)} texts")
    for row, out in enumerate(outputs):
        if getattr(out, "error", None) is not None or not out.outputs.embedding:
            raise RuntimeError(
                f"vLLM could not embed text {row} of this chunk: {getattr(out, 'error', None) or 'empty vector'}"
            )
    return np.asarray([out.outputs.embedding for out in outputs], dtype=np.float32)
