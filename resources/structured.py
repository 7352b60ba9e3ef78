"""Structured output: the one place it is described, mapped to Arrow and validated, for every provider.

A pipeline spec's `task.structured` section becomes a `StructuredOutput`. From it come
- the constraint fields of `GenerationParams` (`generation_constraints()`), which each provider enforces its own
  way (xgrammar in the transformers generator, `StructuredOutputsParams` in vLLM, `response_format` for OpenAI);
- the Arrow type of the parsed column (`arrow_type_for`), fixed before any row is generated, so every partition of
  a pipeline writes the same schema whatever the model answered;
- the check of each row's text (`validate_output`), the same for every provider: a constrained provider should
  always pass it, an unconstrained one (or one cut off by max_new_tokens) gets a row error, never a crash.

JSON Schema itself (checking a schema, validating a value, following $refs; `jsonschema` when installed, else a
built-in subset) is resources/json_schema.py.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from batch_assets.resources.json_schema import (
    DuplicateKeyError,
    check_schema,
    close_objects,
    loads_answer,
    resolve_ref,
    schema_problem,
)

_KINDS = ("choices", "regex", "json_schema", "pydantic_model")
# Every message of an answer that does not satisfy the constraint holds this mark (providers may wrap the message,
# e.g. "stopped at max_new_tokens ... (<message>)"): the infer loop tells such rows from failed requests by it.
UNPARSEABLE = "unparseable answer"


def is_unparseable(error: str | None) -> bool:
    """Whether a row error is an answer that did not parse as the structured output (not a failed request)."""
    return error is not None and UNPARSEABLE in error


class StructuredOutput(BaseModel):
    """The `task.structured` section of a pipeline spec: exactly one of the four constraint kinds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    choices: list[str] | None = Field(
        default=None, description="The answer is exactly one of these labels (classification without parsing)."
    )
    regex: str | None = Field(
        default=None,
        description="The answer fully matches this regular expression. Keep to the syntax Python, xgrammar and vLLM "
        "share (classes, groups, alternation, quantifiers); no look-arounds or back-references.",
    )
    json_schema: dict[str, Any] | None = Field(
        default=None, description="The answer is JSON valid against this schema."
    )
    pydantic_model: str | None = Field(
        default=None,
        description="'package.module:ClassName' of a pydantic model; its JSON schema is used as `json_schema`. "
        "The module must be importable where the code location loads and where runs execute (the same Python "
        "path): a module of this project (e.g. batch_assets/examples/), or a package installed in the virtualenv / "
        "worker image. It is imported when the spec loads, so a wrong path is reported at definition load.",
    )
    allow_extra_keys: bool = Field(
        default=False,
        description="Let the model add keys the schema does not list. Off by default: every object of the schema "
        "that lists its properties gets `additionalProperties: false` (an object that sets additionalProperties "
        "itself keeps it), so the decoder cannot append keys, repeated ones included. Extra keys are never "
        "published either way: the parsed value holds the listed properties only.",
    )
    unnest: bool = Field(
        default=False,
        description="Spread the parsed object's properties into top-level columns (Daft's `unnest`) instead of "
        "one struct column. Only for object schemas.",
    )
    on_unparseable: Literal["row_error", "fail"] = Field(
        default="row_error",
        description="An answer that does not parse as this output: 'row_error': that row's error (its raw answer "
        "kept in the output column and the dead letters), counted against runtime.max_error_fraction by the "
        "blocking error_rate check; 'fail': the step fails at the first chunk holding one, showing the raw answers.",
    )
    stop_after_unparseable: int = Field(
        default=5,
        ge=0,
        description="When the first this many answers of a partition all fail to parse in the same way (an "
        "endpoint that ignores the constraint, a prompt the model misreads), the step stops before sending the "
        "rest of the partition, showing their raw answers. 0: never stop early (nor does a pipeline whose "
        "runtime.max_error_fraction is 1, which accepts every row failing).",
    )

    @model_validator(mode="after")
    def _check(self) -> StructuredOutput:
        given = [k for k in _KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"structured output needs exactly one of {', '.join(_KINDS)}; got {given or 'none'}"
            )
        if self.choices is not None:
            if not self.choices:
                raise ValueError("structured.choices is empty: give at least one label")
            if len(set(self.choices)) != len(self.choices):
                raise ValueError(f"structured.choices has duplicate labels: {self.choices}")
            if any(not c.strip() for c in self.choices):
                raise ValueError("structured.choices has a blank label")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"structured.regex {self.regex!r} does not compile: {exc}") from None
        schema = self.resolved_json_schema()
        if schema is not None:
            check_schema(schema)
        arrow_type = arrow_type_for(self)  # raises on schemas that have no Arrow shape, before any row runs
        if self.unnest and not pa.types.is_struct(arrow_type):
            raise ValueError(
                f"structured.unnest needs an object schema with properties; this output is {arrow_type}"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) is not None)

    def resolved_json_schema(self) -> dict[str, Any] | None:
        """`json_schema`, or the JSON schema of `pydantic_model`, with `additionalProperties: false` on its objects
        unless `allow_extra_keys`; None for choices and regex. This is the schema every provider sends and every
        answer is validated against."""
        if self.json_schema is not None:
            schema = self.json_schema
        elif self.pydantic_model is not None:
            schema = _pydantic_schema(self.pydantic_model)
        else:
            return None
        return schema if self.allow_extra_keys else _closed(json.dumps(schema))

    def generation_constraints(self) -> dict[str, Any]:
        """The constraint fields of `GenerationParams` (`GenerationParams(**other, **this)`)."""
        if self.choices is not None:
            return {"choices": tuple(self.choices)}
        if self.regex is not None:
            return {"regex": self.regex}
        return {"json_schema": self.resolved_json_schema()}

    @classmethod
    def from_params(cls, params: Any) -> StructuredOutput | None:
        """The constraint a `GenerationParams` carries, or None (providers use it to validate their own output)."""
        given = {
            "choices": None if params.choices is None else list(params.choices),
            "regex": params.regex,
            "json_schema": params.json_schema,
        }
        given = {k: v for k, v in given.items() if v is not None}
        # The params carry the schema already resolved (closed, or left open by the spec's allow_extra_keys):
        # it is taken as it is, never closed a second time behind the spec's back.
        return cls(**given, allow_extra_keys=True) if given else None  # two constraints: refused by the validator


@functools.lru_cache(maxsize=64)
def _closed(schema_json: str) -> dict[str, Any]:
    return close_objects(json.loads(schema_json))


@functools.lru_cache(maxsize=64)
def _pydantic_schema(target: str) -> dict[str, Any]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"structured.pydantic_model {target!r} must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"structured.pydantic_model {target!r}: cannot import {module_name!r}: {exc}") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        raise ValueError(f"structured.pydantic_model {target!r}: {attr!r} is not a pydantic BaseModel class")
    return cls.model_json_schema()


# -- JSON schema -> Arrow --------------------------------------------------------------------------------------------
# A schema is first reduced to a plan, a tree of the shapes Arrow can hold; the Arrow type and the conversion of
# parsed values both come from the same plan, so a value always fits its column. Parts with no fixed shape
# (free-form objects, untyped or mixed unions, recursive $refs) become JSON text in a string column.

_SCALARS = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}


def _json_type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "json"


def _plan(node: Any, root: dict[str, Any], refs: tuple[str, ...] = ()) -> tuple:
    node, refs = resolve_ref(node, root, refs)
    if "$recursive" in node:
        return ("json",)
    for union in ("anyOf", "oneOf"):
        if isinstance(node.get(union), list):
            branches = [b for b in node[union] if not (isinstance(b, dict) and b.get("type") == "null")]
            plans = {_plan(b, root, refs) for b in branches}
            if len(plans) == 1:
                return plans.pop()
            if plans == {("scalar", "integer"), ("scalar", "number")}:
                return ("scalar", "number")
            return ("json",)
    types = node.get("type")
    if isinstance(types, list):
        types = [t for t in types if t != "null"]
        if set(types) == {"integer", "number"}:
            types = ["number"]
        types = types[0] if len(types) == 1 else None if not types else "mixed"
    if types is None:
        if "properties" in node:
            types = "object"
        elif "items" in node:
            types = "array"
        elif "enum" in node or "const" in node:
            values = node.get("enum", [node.get("const")])
            kinds = {_json_type_of(v) for v in values} - {"null"}
            if kinds == {"integer", "number"}:
                kinds = {"number"}
            types = kinds.pop() if len(kinds) == 1 else "mixed"
    if types in _SCALARS:
        return ("scalar", types)
    if types == "object":
        props = node.get("properties")
        if isinstance(props, dict) and props:
            return ("struct", tuple((name, _plan(sub, root, refs)) for name, sub in props.items()))
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return ("map", _plan(extra, root, refs))
        return ("json",)
    if types == "array":
        items = node.get("items")
        if isinstance(items, dict) and "prefixItems" not in node:
            return ("list", _plan(items, root, refs))
        return ("json",)
    if types == "null":
        raise ValueError("a JSON schema whose only type is null has no useful Arrow type")
    return ("json",)  # untyped ({}), mixed unions


def _arrow(plan: tuple) -> pa.DataType:
    tag = plan[0]
    if tag == "scalar":
        return _SCALARS[plan[1]]
    if tag == "struct":
        return pa.struct([pa.field(name, _arrow(sub), nullable=True) for name, sub in plan[1]])
    if tag == "list":
        return pa.list_(_arrow(plan[1]))
    if tag == "map":
        return pa.map_(pa.string(), _arrow(plan[1]))
    return pa.string()  # json text


@functools.lru_cache(maxsize=128)
def _plan_for_json(schema_json: str) -> tuple:
    schema = json.loads(schema_json)
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    return _plan(schema, schema)


def _plan_for(structured: StructuredOutput) -> tuple:
    schema = structured.resolved_json_schema()
    if schema is None:
        return ("scalar", "string")
    return _plan_for_json(json.dumps(schema))  # not sort_keys: property order is column order


def arrow_type_for(structured: StructuredOutput) -> pa.DataType:
    """The Arrow type of the parsed value: choices and regex -> string; JSON schemas mapped structurally
    (object -> struct, array -> list, string/enum -> string, integer -> int64, number -> float64, boolean -> bool;
    Optional/nullable -> the same type, every field nullable; $ref/$defs resolved; shapeless parts -> JSON text)."""
    return _arrow(_plan_for(structured))


def _conform(value: Any, plan: tuple) -> Any:
    """A validated JSON value reshaped to fit the plan's Arrow type (unknown keys dropped, missing keys null)."""
    if value is None:
        return None
    tag = plan[0]
    if tag == "scalar":
        kind = plan[1]
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
        if kind == "boolean":
            return bool(value)
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if tag == "struct":
        return {name: _conform(value.get(name), sub) for name, sub in plan[1]}
    if tag == "list":
        return [_conform(v, plan[1]) for v in value]
    if tag == "map":
        return [(str(k), _conform(v, plan[1])) for k, v in value.items()]
    return json.dumps(value, ensure_ascii=False)


# -- validation ------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)
_QUOTES = ('"', "'", "`")


def validate_output(text: str | None, structured: StructuredOutput,
                    finish_reason: str | None = None) -> tuple[Any, str | None]:
    """(value, None) when `text` satisfies the constraint, value shaped for `arrow_type_for(structured)`;
    else (None, a message saying what is wrong). The caller keeps the raw text either way.

    `finish_reason` (Generation.finish_reason, where the provider reports it) decides the hint for JSON that does
    not parse: "length" is output cut off at max_new_tokens; any other reason means the model ended the answer
    itself, so the endpoint did not enforce the format. Unknown (None): guessed from unclosed brackets."""
    if text is None:
        return None, "no output text to validate"
    if structured.choices is not None:
        answer = text.strip()
        if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in _QUOTES:
            answer = answer[1:-1].strip()
        if answer in structured.choices:
            return answer, None
        return None, f"{UNPARSEABLE}: output {_clip(text)} is not one of the labels {structured.choices}"
    if structured.regex is not None:
        pattern = _compiled(structured.regex)
        for candidate in (text, text.strip()):
            if pattern.fullmatch(candidate):
                return candidate, None
        return None, f"{UNPARSEABLE}: output {_clip(text)} does not fully match the regex {structured.regex!r}"
    schema = structured.resolved_json_schema()
    assert schema is not None
    body = text
    fenced = _FENCE.match(text)
    if fenced:  # unconstrained chat models like to wrap JSON in a ```json fence
        body = fenced.group(1)
    try:
        value = loads_answer(body)
    except DuplicateKeyError as exc:
        return None, f"{UNPARSEABLE}: output {_clip(text)} is ambiguous JSON: {exc}"
    except json.JSONDecodeError as exc:
        hint = _json_hint(body, exc, finish_reason)
        return None, f"{UNPARSEABLE}: output {_clip(text)} is not valid JSON: {exc.msg} (character {exc.pos}){hint}"
    problem = schema_problem(value, schema)
    if problem is not None:
        return None, f"{UNPARSEABLE}: output {_clip(text)} does not match the schema: {problem}"
    return _conform(value, _plan_for(structured)), None


def build_columns(
    values: Sequence[Any], structured: StructuredOutput, column: str
) -> tuple[list[str], list[pa.Array]]:
    """Arrow columns for validated values (None for failed rows): one `column` of `arrow_type_for(structured)`, or
    with `unnest` one column per top-level property (named after it)."""
    arrow_type = arrow_type_for(structured)
    array = pa.array(list(values), type=arrow_type)
    if not structured.unnest:
        return [column], [array]
    names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
    return names, list(array.flatten())  # flatten() keeps a failed row null in every unnested column


def _json_hint(body: str, exc: json.JSONDecodeError, finish_reason: str | None) -> str:
    if finish_reason == "length":
        return " (the output stopped at max_new_tokens before the JSON was complete: raise max_new_tokens)"
    if finish_reason is not None:  # the model stopped by itself: a length limit is not the cause
        what = "went on after the JSON" if exc.msg == "Extra data" else "ended the answer itself"
        return (f" (finish_reason={finish_reason}: the model {what}, so the endpoint did not enforce the output "
                "format)")
    return " (the output looks cut off: raise max_new_tokens)" if _unclosed(body) else ""


def _unclosed(body: str) -> bool:
    """Whether JSON text ends inside a string or an open object/array: the mark of output cut off mid-way."""
    depth, in_string, escaped = 0, False, False
    for ch in body:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_string or depth > 0


@functools.lru_cache(maxsize=64)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
