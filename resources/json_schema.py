"""JSON Schema for structured outputs: checking a schema, validating a value against it, following local $refs.

Validation uses the `jsonschema` package when it is installed; without it a small built-in validator covers the
keywords pydantic and hand-written schemas use (type, enum, const, properties, required, additionalProperties,
items, anyOf/oneOf/allOf, $ref, length/size/range bounds, pattern). resources/structured.py is its one user.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Keywords whose subschemas are schemas in their own right, by how they hold them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
               "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def resolve_ref(node: Any, root: dict[str, Any], refs: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Follow $ref (local ones) and single-item allOf, merging sibling keywords; return the node and the ref path."""
    while isinstance(node, dict):
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise ValueError(f"JSON schema $ref {ref!r} is not local ('#/$defs/...'): inline the definition")
            if ref in refs:  # recursive type: no fixed Arrow shape
                return {"$recursive": ref}, refs
            target: Any = root
            for part in ref.lstrip("#").strip("/").split("/") if ref != "#" else []:
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise ValueError(f"JSON schema $ref {ref!r} points at nothing")
                target = target[part]
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            node, refs = {**target, **siblings}, (*refs, ref)
        elif isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            siblings = {k: v for k, v in node.items() if k != "allOf"}
            node = {**node["allOf"][0], **siblings}
        else:
            return node, refs
    if node is True:
        return {}, refs
    raise ValueError(f"unsupported JSON schema node: {node!r}")


def map_subschemas(node: dict[str, Any], fn: Any) -> dict[str, Any]:
    """A copy of one schema node with `fn` applied to each of its direct subschemas (properties, items, $defs,
    anyOf branches, ...), and to nothing else: a property named "enum" or "pattern" is a subschema like any other."""
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {name: fn(sub) for name, sub in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [fn(sub) for sub in node[key]]
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out[key] = fn(node[key])
    return out


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` with `additionalProperties: false` on every object that lists its `properties` and says
    nothing about other keys. Without it some decoders let the model append keys of its own (vLLM's guidance
    backend; any JSON where a server dropped the schema), OpenAI's strict mode refuses the schema, and validation
    would accept an answer whose extra keys then vanish unseen (docs/structured-outputs.md).

    Left open on purpose: objects that already say `additionalProperties` / `unevaluatedProperties` /
    `patternProperties` (the user's explicit choice), free-form objects without `properties` (closing them would
    allow only `{}`), and the parts of a several-branch `allOf` and the object holding it (each branch lists only
    some of the properties, so closing any one would refuse the others' keys)."""

    def walk(node: Any, in_all_of: bool = False) -> Any:
        if not isinstance(node, dict):
            return node
        out = map_subschemas(node, walk)
        several_all_of = isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1
        if several_all_of:
            out["allOf"] = [walk(sub, in_all_of=True) for sub in node["allOf"]]
        open_by_choice = any(k in node for k in ("additionalProperties", "unevaluatedProperties",
                                                  "patternProperties", "$ref"))
        lists_properties = isinstance(node.get("properties"), dict) and bool(node["properties"])
        if lists_properties and not (open_by_choice or in_all_of or several_all_of):
            out["additionalProperties"] = False
        return out

    return walk(schema)


class DuplicateKeyError(ValueError):
    """An answer's JSON names one key twice in an object: which value is meant is not defined (json.loads keeps the
    last, other parsers the first), so the answer is refused rather than silently read one way."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(f"the key {key!r} appears twice in one object (values {_short(seen[key])} and "
                                    f"{_short(value)})")
        seen[key] = value
    return seen


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:40] + "..."


def loads_answer(text: str) -> Any:
    """`json.loads`, except that a key repeated in one object raises DuplicateKeyError."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys)


def check_schema(schema: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:
        if not isinstance(schema, dict):
            raise ValueError("structured.json_schema must be a JSON object") from None
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"structured.json_schema is not a valid JSON schema: {exc.message}") from None


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """The first reason `value` is not valid against `schema`, or None."""
    try:
        import jsonschema
    except ImportError:
        return _subset_problem(value, schema, schema, "$")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    # format is checked too (jsonschema only annotates it by default): a decoder that does not enforce a format
    # must not get a wrong date into a published column.
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return f"at {error.json_path}: {error.message}{_rule(error.validator, error.validator_value)}"


# Rules whose bound is short enough to repeat in the message, so it says which rule the value broke and its bound.
_BOUNDED_RULES = frozenset({"maxLength", "minLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                            "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "const"})


def _rule(name: Any, bound: Any) -> str:
    if name in _BOUNDED_RULES:
        return f" (schema rule {name}: {json.dumps(bound, ensure_ascii=False)})"
    return f" (schema rule {name})" if isinstance(name, str) else ""


# -- the fallback validator: a subset of JSON Schema, used only when `jsonschema` is not installed --------------------

def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
    }.get(kind, lambda v: True)(value)


def _subset_problem(value: Any, node: Any, root: dict[str, Any], path: str) -> str | None:
    if node is True or node == {}:
        return None
    if node is False:
        return f"at {path}: no value is allowed here"
    while "$ref" in node:
        resolved, _ = resolve_ref({"$ref": node["$ref"]}, root, ())
        node = {**resolved, **{k: v for k, v in node.items() if k != "$ref"}}
    types = node.get("type")
    if types is not None:
        allowed = types if isinstance(types, list) else [types]
        if not any(_is_type(value, t) for t in allowed):
            return f"at {path}: {value!r} is not of type {' or '.join(map(repr, allowed))}"
    if "enum" in node and value not in node["enum"]:
        return f"at {path}: {value!r} is not one of {node['enum']}"
    if "const" in node and value != node["const"]:
        return f"at {path}: {value!r} was expected to be {node['const']!r}"
    for sub in node.get("allOf", []):
        if (problem := _subset_problem(value, sub, root, path)) is not None:
            return problem
    for union in ("anyOf", "oneOf"):
        if union in node:
            passing = [b for b in node[union] if _subset_problem(value, b, root, path) is None]
            if not passing or (union == "oneOf" and len(passing) > 1):
                return f"at {path}: {value!r} is not valid under {'exactly ' if union == 'oneOf' else 'any '}one of " \
                       f"the {union} schemas"
    if isinstance(value, str):
        if len(value) < node.get("minLength", 0):
            return f"at {path}: {value!r} is shorter than {node['minLength']}"
        if "maxLength" in node and len(value) > node["maxLength"]:
            return f"at {path}: {value!r} is longer than {node['maxLength']}"
        if "pattern" in node and not re.search(node["pattern"], value):
            return f"at {path}: {value!r} does not match {node['pattern']!r}"
    if _is_type(value, "number"):
        for key, fails in (
            ("minimum", lambda v, b: v < b),
            ("maximum", lambda v, b: v > b),
            ("exclusiveMinimum", lambda v, b: v <= b),
            ("exclusiveMaximum", lambda v, b: v >= b),
        ):
            if key in node and not isinstance(node[key], bool) and fails(value, node[key]):
                return f"at {path}: {value!r} violates {key} {node[key]}"
    if isinstance(value, dict):
        for name in node.get("required", []):
            if name not in value:
                return f"at {path}: {name!r} is a required property"
        props = node.get("properties", {})
        for name, sub in value.items():
            if name in props:
                if (problem := _subset_problem(sub, props[name], root, f"{path}.{name}")) is not None:
                    return problem
            elif node.get("additionalProperties") is False:
                return f"at {path}: additional property {name!r} is not allowed"
            elif isinstance(node.get("additionalProperties"), dict):
                problem = _subset_problem(sub, node["additionalProperties"], root, f"{path}.{name}")
                if problem is not None:
                    return problem
    if isinstance(value, list):
        if len(value) < node.get("minItems", 0):
            return f"at {path}: expected at least {node['minItems']} items, got {len(value)}"
        if "maxItems" in node and len(value) > node["maxItems"]:
            return f"at {path}: expected at most {node['maxItems']} items, got {len(value)}"
        if isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                if (problem := _subset_problem(item, node["items"], root, f"{path}[{i}]")) is not None:
                    return problem
    return None
