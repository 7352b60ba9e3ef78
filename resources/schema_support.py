"""What each structured-output backend's decoder really enforces of a JSON schema, and the warning that says so.

A decoder that does not enforce a keyword still lets the answer through; the pipeline then validates every answer
against the whole schema (resources/structured.py), so a broken `maxLength` is a row error, never a published value.
What the backend leaves to that check is said once per process and schema, at the first structured call, before
any request is sent: a warning naming the keyword, where it is in the schema, and the backend.

`ENFORCEMENT` is the table docs/structured-outputs.md shows. The xgrammar and llama.cpp columns were measured here
(bench/structured_enforcement.py; tests/resources/test_structured_backends.py keeps them true); the OpenAI and
vLLM columns are taken from their documentation and source (links in the docs), since neither runs here.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# Backend keys: how the schema reaches the decoder.
XGRAMMAR = "xgrammar"  # the transformers provider's constrained decoding (resources/hf/constrained.py)
LLAMA_CPP = "llama.cpp"  # llama.cpp's server grammar: response_format {"type": "json_object", "schema": ...}
OPENAI = "openai"  # OpenAI's strict json_schema response_format
VLLM = "vllm"  # vLLM's structured outputs (engine or server), backend "auto": xgrammar, else guidance
ANTHROPIC = "anthropic"  # Anthropic's structured outputs: output_config.format json_schema (anthropic_api/payloads.py)

BACKEND_NAMES = {
    XGRAMMAR: "xgrammar (transformers provider)",
    LLAMA_CPP: "llama.cpp server grammar",
    OPENAI: "OpenAI strict json_schema",
    VLLM: "vLLM structured outputs (auto backend)",
    ANTHROPIC: "Anthropic structured outputs",
}

# The rows of the table; a schema's use of a keyword is found by `_uses` below.
KEYWORDS = (
    "type", "enum", "const", "required", "additionalProperties", "nested objects", "arrays",
    "maxLength", "minLength", "maxLength/minLength with pattern or format", "pattern", "pattern without ^...$",
    "pattern with look-arounds or back-references",
    "minimum/maximum", "exclusiveMinimum/exclusiveMaximum", "multipleOf", "minItems/maxItems", "uniqueItems",
    "format",
)

# Formats each decoder builds into its grammar; any other format is left to validation.
FORMATS = {
    # the formats xgrammar's converter builds (vLLM's backend_xgrammar.py STRING_SUPPORTED_FORMATS; date and email
    # measured here)
    XGRAMMAR: frozenset({"email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
                         "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}),
    # llama-cpp-python's converter: STRING_FORMAT_RULES and uuid (measured: date yes, email no)
    LLAMA_CPP: frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}),
    # OpenAI's documented list for strict mode
    OPENAI: frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}),
    # vLLM auto: xgrammar's formats, any other goes to guidance, which builds a grammar for it or refuses the request
    VLLM: frozenset({"*"}),
    # the SDK's transform_schema keeps these and moves any other into the description
    ANTHROPIC: frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}),
}

_ALL = {k: True for k in KEYWORDS}
# True: the decoder enforces it; False: only validation after decoding does. `format` is per value (FORMATS).
ENFORCEMENT: dict[str, dict[str, bool]] = {
    XGRAMMAR: {**_ALL, "maxLength/minLength with pattern or format": False, "multipleOf": False,
               "uniqueItems": False, "pattern with look-arounds or back-references": False},
    # "pattern without ^...$": llama-cpp-python's server drops the whole schema for it, so the provider sends every
    # pattern anchored (openai_api/payloads.py anchored_patterns), enforced then as a whole-string match
    # "pattern with look-arounds or back-references": no grammar here holds them; xgrammar ignores the look-around
    # (measured), llama-cpp-python's server silently drops the whole schema
    LLAMA_CPP: {**_ALL, "maxLength/minLength with pattern or format": False, "minimum/maximum": False,
                "pattern with look-arounds or back-references": False,
                "exclusiveMinimum/exclusiveMaximum": False, "multipleOf": False, "uniqueItems": False},
    OPENAI: {**_ALL, "maxLength": False, "minLength": False, "maxLength/minLength with pattern or format": False,
             "uniqueItems": False, "pattern with look-arounds or back-references": False},  # the last: undocumented
    # the last: vLLM sends such a pattern to xgrammar, which ignores the look-around (measured for xgrammar)
    VLLM: {**_ALL, "pattern with look-arounds or back-references": False},
    # Anthropic's documented limits (structured outputs: JSON schema limitations); anthropic.transform_schema moves
    # these keywords into the description, where they guide and do not bind
    ANTHROPIC: {**_ALL, "maxLength": False, "minLength": False, "maxLength/minLength with pattern or format": False,
                "minimum/maximum": False, "exclusiveMinimum/exclusiveMaximum": False, "multipleOf": False,
                "minItems/maxItems": False, "uniqueItems": False,
                "pattern with look-arounds or back-references": False},
}

# Said with the warning where not enforcing a keyword costs more than that keyword.
CONSEQUENCES = {
    (LLAMA_CPP, "pattern with look-arounds or back-references"): "llama-cpp-python's server cannot turn it into a "
    "grammar and then silently drops the WHOLE schema (the decoder allows any JSON, extra keys included)",
}
_NO_GRAMMAR = re.compile(r"\\(?:[1-9]|k<)|\(\?(?:[=!]|<[=!])")


def _pattern_anchored(pattern: Any) -> bool:
    return isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")


def _uses(node: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """(keyword row, format value or None) for each row of the table this one schema node uses."""
    if "type" in node:
        yield "type", None
    for key in ("enum", "const", "required", "minLength", "maxLength", "multipleOf", "uniqueItems"):
        if key in node:
            yield key, None
    if node.get("additionalProperties") is False:
        yield "additionalProperties", None
    if ("minLength" in node or "maxLength" in node) and ("pattern" in node or "format" in node):
        yield "maxLength/minLength with pattern or format", None
    if "pattern" in node:
        yield ("pattern" if _pattern_anchored(node["pattern"]) else "pattern without ^...$"), None
        if isinstance(node["pattern"], str) and _NO_GRAMMAR.search(node["pattern"]):
            yield "pattern with look-arounds or back-references", None
    if "minimum" in node or "maximum" in node:
        yield "minimum/maximum", None
    if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
        yield "exclusiveMinimum/exclusiveMaximum", None
    if "minItems" in node or "maxItems" in node:
        yield "minItems/maxItems", None
    if isinstance(node.get("format"), str):
        yield "format", node["format"]


def _walk(node: Any, path: str) -> Iterator[tuple[dict[str, Any], str]]:
    if not isinstance(node, dict):
        return
    yield node, path
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                yield from _walk(sub, f"{path}.{name}" if key == "properties" else f"{path}/{key}/{name}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                yield from _walk(sub, f"{path}({key} {i})")
    for key in ("items", "additionalProperties", "not", "contains"):
        if isinstance(node.get(key), dict):
            yield from _walk(node[key], f"{path}[]" if key == "items" else f"{path}({key})")


def unenforced(schema: dict[str, Any], backend: str) -> list[str]:
    """What of `schema` the backend's decoder leaves to validation: one line per keyword row, with where it is."""
    table = ENFORCEMENT[backend]
    found: dict[str, list[str]] = {}
    for node, path in _walk(schema, "$"):
        for keyword, fmt in _uses(node):
            if keyword == "format":
                formats = FORMATS[backend]
                if "*" in formats or fmt in formats:
                    continue
                keyword = f"format {fmt!r}"
            elif table.get(keyword, True):
                continue
            found.setdefault(keyword, []).append(path)
    lines = []
    for keyword, paths in found.items():
        where = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        consequence = CONSEQUENCES.get((backend, keyword))
        lines.append(f"{keyword} (at {where})" + (f": {consequence}" if consequence else ""))
    return lines


_WARNED: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


def warn_unenforced(schema: dict[str, Any] | None, backend: str, emit: Callable[[str], None] | None = None,
                    who: str = "") -> list[str]:
    """Say, once per process for this backend and schema, what the decoder will not enforce (`emit`: the
    provider's warning log, else this module's logger); returns the lines (empty when the decoder enforces all the
    schema uses, and on every later call)."""
    if schema is None:
        return []
    key = (backend, json.dumps(schema, sort_keys=True))
    with _WARNED_LOCK:
        if key in _WARNED:
            return []
        _WARNED.add(key)
    lines = unenforced(schema, backend)
    if lines:
        message = (
            f"{who + ': ' if who else ''}structured output through {BACKEND_NAMES[backend]}: the decoder does not "
            f"enforce {'; '.join(lines)}. Every answer is still validated against the whole schema, so an answer "
            "that breaks one of these becomes a row error (never a published value); expect more of them "
            "(docs/structured-outputs.md#what-each-backend-enforces)."
        )
        (emit or log.warning)(message)
    return lines
