"""GenerationParams and chat conversations -> Anthropic Messages API request bodies, and Messages -> Generation.

The pipeline speaks OpenAI's chat shape everywhere (system/user messages, image_url content parts); Anthropic's
differs in three places, mapped here once for the online and the batch path alike:
- the system prompt is the request's top-level `system`, not a message;
- an image is `{"type": "image", "source": {"type": "base64", "media_type", "data"}}`;
- structured output is `output_config.format = {"type": "json_schema", "schema": ...}` (Anthropic's structured
  outputs, documented by the SDK 2.x `OutputConfigParam`), the schema passed through the SDK's own
  `anthropic.transform_schema` (objects closed, the keywords the API does not take moved into descriptions: every
  answer is still validated against the whole schema afterwards). `choices` travels as a one-field `{"label": <enum>}` object, as on the OpenAI path; `regex` has no
  Anthropic form and is refused before any request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batch_assets.resources.openai_api.payloads import UnsupportedConstraintError, _choice_budget, choices_schema, \
    label_from_json
from batch_assets.resources.openai_api.retry import MalformedResponse
from batch_assets.resources.protocols import Conversation, Generation, GenerationParams

# stop_reason -> the finish_reason the rest of the pipeline reads ("length": cut off at max_new_tokens)
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "stop"}


@dataclass(frozen=True)
class MessagesPlan:
    """Everything about a generate call that is the same for every row: the request fields besides `model`,
    `messages` and `system`."""

    body: dict[str, Any]
    max_tokens: int
    decode: Callable[[str], str] = field(default=lambda text: text)


def plan_messages(params: GenerationParams, extra_body: dict[str, Any]) -> MessagesPlan:
    """Raises UnsupportedConstraintError before any request when the constraint has no Anthropic form."""
    set_constraints = [n for n in ("choices", "regex", "json_schema") if getattr(params, n)]
    if len(set_constraints) > 1:
        raise UnsupportedConstraintError(f"at most one structured-output constraint per call; got {set_constraints}")
    if params.regex is not None:
        raise UnsupportedConstraintError(
            "a `regex` constraint cannot be sent to Anthropic's API (its structured outputs take a JSON schema): "
            "express the output as a JSON schema or as choices")
    # No temperature / top_p: the Messages API of SDK 2.x takes neither (MessageCreateParams has no such field); the
    # provider says so once when the spec asks for other than the defaults.
    body: dict[str, Any] = {}
    if params.stop:
        body["stop_sequences"] = list(params.stop)
    max_tokens = params.max_new_tokens
    decode: Callable[[str], str] = lambda text: text  # noqa: E731
    schema = None
    if params.choices is not None:
        if not params.choices:
            raise UnsupportedConstraintError("`choices` is empty: give at least one label")
        schema = choices_schema(tuple(params.choices))
        decode = label_from_json
        max_tokens = max(max_tokens, _choice_budget(tuple(params.choices), wrapped=True))
    elif params.json_schema is not None:
        from anthropic import transform_schema

        schema = transform_schema(params.json_schema)
    if schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
    body = {**body, **extra_body, **params.extra, "max_tokens": max_tokens}
    return MessagesPlan(body=body, max_tokens=max_tokens, decode=decode)


def _part(part: Any) -> dict[str, Any]:
    if isinstance(part, dict) and part.get("type") == "text":
        return {"type": "text", "text": part.get("text", "")}
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = part.get("image_url", {})
        url = url.get("url") if isinstance(url, dict) else url
        header, sep, data = str(url).partition(",")
        if url and str(url).startswith("data:") and sep and ";base64" in header:
            return {"type": "image", "source": {"type": "base64", "media_type": header[5:].split(";")[0],
                                                "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    raise UnsupportedConstraintError(f"a {kind!r} content part has no Anthropic form in this provider (text and images "
                                     "only): send documents as text (prepare.documents)")


def to_messages(conversation: Conversation) -> tuple[str | None, list[dict[str, Any]]]:
    """(system, messages) of one row: system messages joined into the top-level system prompt."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for message in conversation:
        content = message.get("content")
        if message.get("role") == "system":
            system.append(content if isinstance(content, str) else
                          "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict)))
            continue
        if isinstance(content, list):
            content = [_part(p) for p in content]
        messages.append({"role": message.get("role", "user"), "content": content})
    return ("\n\n".join(system) if system else None), messages


def request_body(model: str, conversation: Conversation, plan: MessagesPlan) -> dict[str, Any]:
    """The whole Messages API body of one row: what the online path POSTs and a batch request's `params`."""
    system, messages = to_messages(conversation)
    body = {"model": model, "messages": messages, **plan.body}
    if system:
        body["system"] = system
    return body


def message_generation(message: Any, decode: Callable[[str], str]) -> Generation:
    """One row's Generation from a Message (the SDK's type or its JSON as a dict); MalformedResponse when it is not
    one. Text is the message's text blocks joined; a refusal or an answer with no text is the row's error."""
    get = (lambda o, k: o.get(k)) if isinstance(message, dict) else (lambda o, k: getattr(o, k, None))
    content = get(message, "content")
    if get(message, "type") != "message" or not isinstance(content, list):
        raise MalformedResponse(f"expected a Message with content blocks, got {str(message)[:200]}")
    usage = get(message, "usage")
    prompt = get(usage, "input_tokens") if usage is not None else None
    completion = get(usage, "output_tokens") if usage is not None else None
    prompt = prompt if isinstance(prompt, int) else None
    completion = completion if isinstance(completion, int) else None
    stop = get(message, "stop_reason")
    finish = FINISH.get(stop) if isinstance(stop, str) else None
    texts = [get(b, "text") or "" for b in content if get(b, "type") == "text"]
    if stop == "refusal":
        return Generation(None, prompt, completion, error=f"the model refused ({''.join(texts)[:200]})".rstrip(),
                          finish_reason=finish)
    if not texts:
        return Generation(None, prompt, completion, error=f"the model returned no text (stop_reason={stop})",
                          finish_reason=finish)
    return Generation(decode("".join(texts)), prompt, completion, finish_reason=finish)
