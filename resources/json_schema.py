"""JSON Schema for structured outputs: checking a schema, validating a value against it, following local $refs.

Validation uses the `jsonschema` package when it is installed; without it a small built-in validator covers the
keywords pydantic and hand-written schemas use (type, enum, const, properties, required, additionalProperties,
items, anyOf/oneOf/allOf, $ref, length/size/range bounds, pattern). resources/structured.py is its one user.
"""

from __future__ import annotations

import math
import re
from typing import Any


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
    error = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    if error is None:
        return None
    return f"at {error.json_path}: {error.message}"


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
