"""A stand-in for vLLM's `LLM` engine, for testing `VLLMEngineProvider` on machines without CUDA.

It is NOT vLLM and generates nothing real: `StandInVLLMEngine` records what the provider hands it (engine
arguments, conversations, SamplingParams, LoRA requests, chat-template kwargs) and answers with objects shaped like
vLLM 0.33's `RequestOutput` / `CompletionOutput` / `EmbeddingRequestOutput`. What it answers is scripted by the test
(`engine.reply`), or by default (`default_reply`): a label for `choice`, `{"echo": ...}` for a JSON schema, an echo
of the last user message otherwise.

Every engine records the process it was built in: `engine.pid` and `engine.cuda_visible_devices` (the
CUDA_VISIBLE_DEVICES that process saw, which is how vLLM picks its GPUs). With `VLLM_STANDIN_LOG=<folder>` in the
environment, each engine also appends its build and every chat/embed call (pid, CUDA_VISIBLE_DEVICES, rows) to
`<folder>/<pid>.jsonl`: how a test sees engines that live in replica worker processes. `VLLM_STANDIN_FAULT=raise:<gpu>`
or `exit:<gpu>` makes the engine whose CUDA_VISIBLE_DEVICES is `<gpu>` raise, or its process die, on its next call
(a CUDA error, an OOM kill).

`standin_vllm_api()` is what a test puts in the provider's `vllm_api` seam. When vLLM is importable (a GPU node)
it keeps vLLM's real `SamplingParams`, `StructuredOutputsParams` and `LoRARequest`, so their own validation runs;
otherwise it uses the look-alike dataclasses below, which carry the same field names as vLLM 0.33's classes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batch_assets.resources.vllm_engine.api import VLLMApi


# -- look-alikes of vLLM 0.33's parameter classes (used only when vllm is not importable) ------------------------------
@dataclass
class LookAlikeStructuredOutputsParams:
    """vllm.sampling_params.StructuredOutputsParams (0.33): exactly one constraint field."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        kinds = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        count = sum(getattr(self, f) is not None for f in kinds)
        if count != 1:
            raise ValueError(f"exactly one kind of structured outputs constraint is allowed; got {count}")


@dataclass
class LookAlikeSamplingParams:
    """The vllm.SamplingParams (0.33) fields the provider may set; unknown keywords fail as they do in vLLM."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: LookAlikeStructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")


@dataclass
class LookAlikeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


# -- look-alikes of vLLM's outputs -------------------------------------------------------------------------------------
@dataclass
class StandInCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: Any = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None


@dataclass
class StandInRequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[StandInCompletionOutput]
    finished: bool = True


@dataclass
class StandInEmbeddingOutput:
    embedding: list[float]


@dataclass
class StandInEmbeddingRequestOutput:
    request_id: str
    outputs: StandInEmbeddingOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True
    error: Any = None


# -- the engine --------------------------------------------------------------------------------------------------------
@dataclass
class ChatCall:
    """One `LLM.chat` call as the engine received it."""

    messages: list[list[dict[str, Any]]]
    sampling_params: Any
    lora_request: Any
    chat_template_kwargs: dict[str, Any] | None
    use_tqdm: Any


Reply = Callable[[list[dict[str, Any]], Any], "tuple[str, str]"]  # (conversation, sampling) -> (text, finish)


def _fake_tokens(text: str) -> list[int]:
    return [len(w) for w in text.split()] or [0]


def default_reply(conversation: list[dict[str, Any]], sampling: Any) -> tuple[str, str]:
    """A label (chosen by a hash of the last message) when the request carries `choice`; `{"echo": <last user
    message>}` when it carries a JSON schema; else `"echo: <last user message>"`."""
    constraint = getattr(sampling, "structured_outputs", None) or getattr(sampling, "guided_decoding", None)
    last = str(conversation[-1].get("content", ""))
    if constraint is not None and getattr(constraint, "choice", None):
        digest = int(hashlib.sha256(last.encode()).hexdigest(), 16)
        return constraint.choice[digest % len(constraint.choice)], "stop"
    if constraint is not None and getattr(constraint, "json", None) is not None:
        return json.dumps({"echo": last}), "stop"
    return f"echo: {last}", "stop"


class StandInVLLMEngine:
    """Records calls and answers like `vllm.LLM`; constructed with the same keyword arguments."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        self.model = model
        self.engine_args = {"model": model, **engine_args}
        self.chat_calls: list[ChatCall] = []
        self.embed_calls: list[list[str]] = []
        self.reply: Reply = default_reply
        self.embedding_dim = 8
        self.pid = os.getpid()
        self.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._record("build", engine_args={k: str(v) for k, v in self.engine_args.items()})

    def _record(self, event: str, **details: Any) -> None:
        folder = os.environ.get("VLLM_STANDIN_LOG")
        if folder:
            line = {"event": event, "pid": self.pid, "cuda_visible_devices": self.cuda_visible_devices, **details}
            with (Path(folder) / f"{self.pid}.jsonl").open("a") as f:
                f.write(json.dumps(line) + "\n")

    def _fault(self) -> None:
        kind, _, gpu = os.environ.get("VLLM_STANDIN_FAULT", "").partition(":")
        if kind and gpu == self.cuda_visible_devices:
            if kind == "exit":
                os._exit(3)
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered (stand-in fault on GPU {gpu})")

    def chat(
        self,
        messages: list[list[dict[str, Any]]],
        sampling_params: Any = None,
        use_tqdm: Any = True,
        lora_request: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> list[StandInRequestOutput]:
        if kwargs:
            raise TypeError(f"StandInVLLMEngine.chat got arguments it does not model: {sorted(kwargs)}")
        self._fault()
        self.chat_calls.append(ChatCall(messages, sampling_params, lora_request, chat_template_kwargs, use_tqdm))
        self._record("chat", rows=[str(c[-1].get("content", "")) for c in messages],
                     systems=[str(c[0].get("content", "")) for c in messages])
        outputs = []
        for n, conversation in enumerate(messages):
            text, finish = self.reply(conversation, sampling_params)
            prompt = "\n".join(f"{m['role']}: {m['content']}" for m in conversation)
            completion = StandInCompletionOutput(0, text, _fake_tokens(text), finish_reason=finish)
            outputs.append(StandInRequestOutput(str(n), prompt, _fake_tokens(prompt), [completion]))
        return outputs

    def embed(
        self, prompts: list[str], *, use_tqdm: Any = True, lora_request: Any = None, **kwargs: Any
    ) -> list[StandInEmbeddingRequestOutput]:
        if kwargs:
            raise TypeError(f"StandInVLLMEngine.embed got arguments it does not model: {sorted(kwargs)}")
        self._fault()
        self.embed_calls.append(list(prompts))
        self._record("embed", rows=list(prompts))
        out = []
        for n, text in enumerate(prompts):
            seed = hashlib.sha256(text.encode()).digest()
            vector = [(seed[i] - 128) / 64.0 for i in range(self.embedding_dim)]
            out.append(StandInEmbeddingRequestOutput(str(n), StandInEmbeddingOutput(vector), _fake_tokens(text)))
        return out


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def standin_vllm_api() -> VLLMApi:
    """The `vllm_api` seam for tests: the stand-in engine, with vLLM's real parameter classes when installed."""
    if vllm_importable():
        from batch_assets.resources.vllm_engine.api import import_vllm_api

        real = import_vllm_api()
        return VLLMApi(
            StandInVLLMEngine, real.SamplingParams, real.StructuredOutputsParams, real.structured_field,
            real.LoRARequest, f"stand-in engine, vLLM {real.version} params",
        )
    return VLLMApi(
        StandInVLLMEngine, LookAlikeSamplingParams, LookAlikeStructuredOutputsParams, "structured_outputs",
        LookAlikeLoRARequest, "stand-in engine, look-alike params",
    )


STANDIN_API = "tests.resources.vllm_engine.vllm_standin:standin_vllm_api"
