"""GenerationParams -> request arguments for the Chat Completions and Responses APIs, and responses -> Generation.

Structured output is where OpenAI-compatible servers differ most, so the mapping is explicit per backend:

- `response_format` (OpenAI, llama.cpp, most servers): `choices` and `json_schema` become a JSON schema, sent as
  OpenAI's `{"type": "json_schema", "json_schema": {"strict": true, ...}}` or llama.cpp's `{"type": "json_object",
  "schema": ...}` form (`json_schema_mode`); `regex` cannot be expressed and is refused before any request. Strict
  mode takes only schemas whose every property is required (`strict_schema`): an optional property is sent as a
  required one that may be null, and such nulls are removed from the answer again (`drop_added_nulls`).
- `vllm`: vLLM >= 0.12 `extra_body={"structured_outputs": {"choice" | "regex" | "json": ...}}`.
- `vllm_legacy`: vLLM < 0.12 `extra_body={"guided_choice" | "guided_regex" | "guided_json": ...}`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from batch_assets.resources.json_schema import DuplicateKeyError, loads_answer, map_subschemas, resolve_ref
from batch_assets.resources.openai_api.retry import MalformedResponse
from batch_assets.resources.protocols import Generation, GenerationParams

Api = Literal["chat", "responses"]
ConstraintBackend = Literal["response_format", "vllm", "vllm_legacy"]
JsonSchemaMode = Literal["json_schema", "json_object_schema"]

# The key of the one-field object a `choices` constraint is wrapped in when it travels as a JSON schema: OpenAI's
# strict mode needs an object at the top level, and an object is what llama.cpp's grammar handles best.
LABEL_KEY = "label"
# The Responses API refuses max_output_tokens below 16.
RESPONSES_MIN_OUTPUT_TOKENS = 16


class UnsupportedConstraintError(ValueError):
    """The configured endpoint cannot enforce the structured-output constraint asked for."""


@dataclass(frozen=True)
class RequestPlan:
    """Everything about a generate call that is the same for every row."""

    kwargs: dict[str, Any]  # create() arguments besides model and messages/input
    max_tokens: int  # the completion budget actually sent (for the token-rate estimate)
    decode: Callable[[str], str] = field(default=lambda text: text)  # raw content -> Generation.text

    @property
    def body(self) -> dict[str, Any]:
        """The JSON fields of the request besides model and messages/input: `kwargs` with `extra_body` merged in
        over them, as the SDK's create() sends it."""
        fields = {k: v for k, v in self.kwargs.items() if k != "extra_body"}
        return {**fields, **self.kwargs.get("extra_body", {})}


def choices_schema(choices: tuple[str, ...]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {LABEL_KEY: {"type": "string", "enum": list(choices)}},
        "required": [LABEL_KEY],
        "additionalProperties": False,
    }


def label_from_json(text: str) -> str:
    """The label out of `{"label": "..."}`; the raw text when it is not that (the pipeline's validation reports it),
    a repeated "label" key included."""
    try:
        value = loads_answer(text)
    except (ValueError, DuplicateKeyError):
        return text
    if isinstance(value, dict) and isinstance(value.get(LABEL_KEY), str):
        return value[LABEL_KEY]
    return text


def _schema_name(schema: dict[str, Any]) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(schema.get("title") or "output"))[:64]
    return name or "output"


# What llama.cpp's servers say in /v1/models `owned_by`: llama-server (C++) and llama-cpp-python's server.
LLAMA_CPP_OWNERS = frozenset({"llamacpp", "me"})


async def detect_json_schema_mode(client: Any, timeout_s: float) -> JsonSchemaMode:
    """'json_object_schema' when the endpoint is a llama.cpp server, else 'json_schema' (OpenAI's form, which OpenAI,
    vLLM and most gateways enforce). llama-cpp-python's server refuses the json_schema form with HTTP 500 and
    ignores a top-level `json_schema` field; `{"type": "json_object", "schema": ...}` is enforced by both llama.cpp
    servers (tests/resources/openai_api/test_openai_llama.py). An endpoint that does not answer /models gets 'json_schema'."""
    try:
        async with asyncio.timeout(timeout_s):
            raw = await client.get("/models", cast_to=bytes)
        models = json.loads(raw).get("data") or []
        owners = {m.get("owned_by") for m in models if isinstance(m, dict)}
    except Exception:  # noqa: BLE001 - no answer is an answer: not a llama.cpp server we can recognise
        return "json_schema"
    return "json_object_schema" if owners & LLAMA_CPP_OWNERS else "json_schema"


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as OpenAI's strict mode takes it: every object lists all its properties in `required`
    (https://platform.openai.com/docs/guides/structured-outputs#all-fields-must-be-required), so a property the
    schema leaves optional is sent as required and nullable (`anyOf: [<its schema>, {"type": "null"}]`), the way
    OpenAI's docs emulate optional fields. `drop_added_nulls` turns the answer back. A schema already strict comes
    back equal."""

    def walk(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = map_subschemas(node, walk)
        props = out.get("properties")
        if isinstance(props, dict) and props:
            required = set(node.get("required") or [])
            out["properties"] = {name: sub if name in required else {"anyOf": [sub, {"type": "null"}]}
                                 for name, sub in props.items()}
            out["required"] = list(props)
        return out

    return walk(schema)


def drop_added_nulls(text: str, schema: dict[str, Any]) -> str:
    """The answer to a `strict_schema(schema)` request as an answer to `schema`: a null the model gave for a property
    `schema` leaves optional is removed (the property is absent, as the schema allows). Text that does not parse is
    returned as it came, for validation to report."""
    try:
        value = loads_answer(text)
    except (ValueError, DuplicateKeyError):
        return text
    dropped = [False]

    def walk(value: Any, node: Any) -> None:
        try:
            node, _ = resolve_ref(node, schema, ())
        except ValueError:
            return
        if isinstance(value, dict):
            branches = [node] + [b for key in ("anyOf", "oneOf") for b in node.get(key, []) if isinstance(b, dict)]
            for branch in branches:
                branch, _ = resolve_ref(branch, schema, ()) if "$ref" in branch else (branch, ())
                props = branch.get("properties")
                if isinstance(props, dict) and props:
                    required = set(branch.get("required") or [])
                    for name in list(value):
                        if value[name] is None and name in props and name not in required:
                            del value[name]
                            dropped[0] = True
                        elif name in props:
                            walk(value[name], props[name])
                    return
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for item in value:
                walk(item, node["items"])

    walk(value, schema)
    return json.dumps(value, ensure_ascii=False) if dropped[0] else text


_NON_CAPTURING = re.compile(r"(?<!\\)\(\?:")


def anchored_patterns(schema: Any) -> Any:
    """`schema` with every `pattern` not written `^...$` sent as `^(...)$`, for llama.cpp's servers.

    llama-cpp-python's grammar converter refuses an unanchored pattern, and its server then silently falls back to a
    grammar for any JSON: the whole schema, not only the pattern, goes unenforced (measured:
    bench/structured_enforcement.py). Anchored, the pattern must match the whole string, as xgrammar and vLLM
    treat every pattern: a subset of what JSON Schema's search semantics accept, so an answer the grammar lets
    through is still valid, and validation afterwards applies the pattern as written."""
    if not isinstance(schema, dict):
        return schema
    out = map_subschemas(schema, anchored_patterns)
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        if not (pattern.startswith("^") and pattern.endswith("$")):
            pattern = "^(" + pattern.removeprefix("^").removesuffix("$") + ")$"
        # a non-capturing group matches what a plain group does; the converter refuses only the former
        out["pattern"] = _NON_CAPTURING.sub("(", pattern)
    return out


def _format_for(schema: dict[str, Any], mode: JsonSchemaMode, api: Api) -> dict[str, Any]:
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": anchored_patterns(schema)}
    if api == "responses":  # the Responses API flattens OpenAI's json_schema wrapper
        return {"type": "json_schema", "name": _schema_name(schema), "schema": schema, "strict": True}
    return {"type": "json_schema", "json_schema": {"name": _schema_name(schema), "schema": schema, "strict": True}}


def _choice_budget(choices: tuple[str, ...], wrapped: bool) -> int:
    """Completion tokens a constrained answer can need: the longest label (at worst ~1 token per 2 characters)
    plus, when wrapped in a JSON object, its braces, key and quotes. Without it a small max_new_tokens would cut
    the JSON in half."""
    longest = max(len(c) for c in choices) // 2 + 2
    return longest + (12 if wrapped else 0)


def plan_request(
    params: GenerationParams,
    *,
    api: Api,
    backend: ConstraintBackend,
    json_schema_mode: JsonSchemaMode,
    max_tokens_param: str,
    extra_body: dict[str, Any],
    store_responses: bool,
) -> RequestPlan:
    """Build the per-call request arguments; raises UnsupportedConstraintError before any request is sent."""
    set_constraints = [n for n in ("choices", "regex", "json_schema") if getattr(params, n)]
    if len(set_constraints) > 1:
        raise UnsupportedConstraintError(f"at most one structured-output constraint per call; got {set_constraints}")
    body = {**extra_body, **params.extra}
    max_tokens = params.max_new_tokens
    output_format: dict[str, Any] | None = None
    decode: Callable[[str], str] = lambda text: text

    if params.choices is not None:
        if not params.choices:
            raise UnsupportedConstraintError("`choices` is empty: give at least one label")
        choices = tuple(params.choices)
        if backend == "response_format":
            output_format = _format_for(choices_schema(choices), json_schema_mode, api)
            decode = label_from_json
        elif backend == "vllm":
            body["structured_outputs"] = {"choice": list(choices)}
        else:
            body["guided_choice"] = list(choices)
        max_tokens = max(max_tokens, _choice_budget(choices, wrapped=backend == "response_format"))
    elif params.regex is not None:
        if backend == "response_format":
            raise UnsupportedConstraintError(
                "a `regex` constraint cannot be sent as an OpenAI response_format: OpenAI and llama.cpp's server "
                "cannot enforce it. Use a vLLM endpoint with constraint_backend='vllm' (or 'vllm_legacy' before "
                "vLLM 0.12), or express the output as a JSON schema."
            )
        if backend == "vllm":
            body["structured_outputs"] = {"regex": params.regex}
        else:
            body["guided_regex"] = params.regex
    elif params.json_schema is not None:
        if backend == "response_format" and json_schema_mode == "json_schema":
            schema = params.json_schema
            sent = strict_schema(schema)
            output_format = _format_for(sent, json_schema_mode, api)
            if sent != schema:
                decode = lambda text: drop_added_nulls(text, schema)  # noqa: E731
        elif backend == "response_format":
            output_format = _format_for(params.json_schema, json_schema_mode, api)
        elif backend == "vllm":
            body["structured_outputs"] = {"json": params.json_schema}
        else:
            body["guided_json"] = params.json_schema

    kwargs: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
    if api == "chat":
        kwargs[max_tokens_param] = max_tokens
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if output_format is not None:
            kwargs["response_format"] = output_format
    else:
        if params.stop:
            raise UnsupportedConstraintError(
                "the Responses API has no stop sequences; use api='chat' or drop `stop` from the task params"
            )
        max_tokens = max(max_tokens, RESPONSES_MIN_OUTPUT_TOKENS)
        kwargs["max_output_tokens"] = max_tokens
        kwargs["store"] = store_responses
        if output_format is not None:
            kwargs["text"] = {"format": output_format}
    if body:
        kwargs["extra_body"] = body
    return RequestPlan(kwargs=kwargs, max_tokens=max_tokens, decode=decode)


def _usage(usage: Any, prompt_field: str, completion_field: str) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    if isinstance(usage, dict):
        prompt, completion = usage.get(prompt_field), usage.get(completion_field)
    else:
        prompt, completion = getattr(usage, prompt_field, None), getattr(usage, completion_field, None)
    return (prompt if isinstance(prompt, int) else None), (completion if isinstance(completion, int) else None)


def chat_generation(body: bytes | dict[str, Any], decode: Callable[[str], str]) -> Generation:
    """One row's Generation from a chat completion's JSON body (bytes as received, or parsed); MalformedResponse
    when it is not a chat completion. Read as plain JSON: building the SDK's pydantic models for every row cost
    more CPU than the request itself at hundreds of requests a second (docs/BENCHMARKS.md)."""
    completion = json.loads(body) if isinstance(body, (bytes, str)) else body
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse(f"expected a chat completion with choices, got {_preview(completion)}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedResponse("the first choice has no message")
    usage = completion.get("usage")
    prompt_tokens, completion_tokens = _usage(usage if isinstance(usage, dict) else None, "prompt_tokens",
                                              "completion_tokens")
    finish_reason = choice.get("finish_reason")
    finish_reason = finish_reason if isinstance(finish_reason, str) else None
    content = message.get("content")
    if not isinstance(content, str):
        refusal = message.get("refusal")
        reason = f"refused: {refusal}" if refusal else f"finish_reason={finish_reason}"
        return Generation(None, prompt_tokens, completion_tokens, error=f"the model returned no text ({reason})",
                          finish_reason=finish_reason)
    return Generation(decode(content), prompt_tokens, completion_tokens, finish_reason=finish_reason)


def responses_generation(response: Any, decode: Callable[[str], str]) -> Generation:
    """One row's Generation from a Responses API response (text from its output_text parts)."""
    output = getattr(response, "output", None)
    if not isinstance(output, list):
        raise MalformedResponse(f"expected a Responses API response with output, got {_preview(response)}")
    prompt_tokens, completion_tokens = _usage(getattr(response, "usage", None), "input_tokens", "output_tokens")
    if getattr(response, "status", None) == "failed":
        error = getattr(getattr(response, "error", None), "message", None) or "no reason given"
        return Generation(None, prompt_tokens, completion_tokens, error=f"the response failed: {error}")
    texts, refusals = [], []
    for item in output:
        if getattr(item, "type", None) != "message":
            continue
        for part in getattr(item, "content", None) or []:
            kind = getattr(part, "type", None)
            if kind == "output_text":
                texts.append(getattr(part, "text", "") or "")
            elif kind == "refusal":
                refusals.append(getattr(part, "refusal", "") or "")
    if not texts:
        reason = f"refused: {' '.join(refusals)}" if refusals else f"status={getattr(response, 'status', None)}"
        return Generation(None, prompt_tokens, completion_tokens, error=f"the model returned no text ({reason})")
    status = getattr(response, "status", None)
    cut = getattr(getattr(response, "incomplete_details", None), "reason", None) == "max_output_tokens"
    finish_reason = "length" if cut else "stop" if status == "completed" else None
    return Generation(decode("".join(texts)), prompt_tokens, completion_tokens, finish_reason=finish_reason)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."
