"""Which JSON-schema keywords each decoder that runs here really enforces: the measurement behind the table in
docs/structured-outputs.md (and `batch_assets.resources.schema_support.ENFORCEMENT`, which tests check against it).

One probe per keyword: a small schema using it, an answer that breaks it and one that keeps it.

- xgrammar (the transformers provider's constrained decoding, resources/hf/constrained.py): the grammar is compiled
  exactly as the provider compiles it (`compact JSON`, `any_whitespace=False`) and asked whether it accepts each
  answer. Exact: an accepted breaking answer means the keyword is not enforced.
- llama.cpp's server (llama-cpp-python's `llama_cpp.server`, the one the tests start): the model is asked to copy the
  breaking answer word for word, once with the schema in `response_format` (the form the product sends) and once
  without. Not enforced: a constrained answer still breaks the rule. Enforced: the unconstrained answers broke it
  (the model tried) and no constrained one did. Anything else: inconclusive.
- llama.cpp's grammar, exactly: the GBNF llama-cpp-python's server builds from the schema (`json_schema_to_gbnf`,
  the function its `response_format` handling calls) parsed by xgrammar's EBNF parser and asked, as above, whether
  it accepts each answer. Where the converter raises, the server silently falls back to its grammar for *any* JSON
  (llama_chat_format._grammar_for_json_schema): the whole schema is then unenforced, not just the keyword.

    .venv/bin/python bench/structured_enforcement.py [--llama-url http://127.0.0.1:PORT/v1] [--json out.json]

Without --llama-url it starts the server itself (tests/resources/openai_api/llama_server.py) and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.resources.openai_api.llama_server
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common, script_io (also when imported by a test)
from common import llama_base_url  # noqa: E402


@dataclass(frozen=True)
class Probe:
    keyword: str
    schema: dict[str, Any]  # the schema of property "a" (the object around it is closed: no extra keys)
    breaks: Any  # a value of "a" that breaks the keyword
    keeps: Any  # a value of "a" that keeps it
    whole: bool = False  # `schema` is the whole object schema, `breaks`/`keeps` whole answers


def _obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or list(props), **extra}


PROBES = [
    Probe("type", {"type": "integer"}, "seven", 7),
    Probe("enum", {"type": "string", "enum": ["red", "green"]}, "blue", "red"),
    Probe("const", {"type": "string", "const": "fixed"}, "other", "fixed"),
    Probe("required", _obj({"a": {"type": "string"}, "b": {"type": "string"}}, additionalProperties=False),
          {"a": "hello"}, {"a": "hello", "b": "world"}, whole=True),
    Probe("additionalProperties", _obj({"a": {"type": "string"}}, additionalProperties=False),
          {"a": "hello", "zzz": "extra"}, {"a": "hello"}, whole=True),
    Probe("maxLength", {"type": "string", "maxLength": 4}, "abcdefghij", "abcd"),
    Probe("minLength", {"type": "string", "minLength": 6}, "ab", "abcdefg"),
    Probe("maxLength with pattern", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "abcdefg", "abc"),
    Probe("pattern (anchored ^...$)", {"type": "string", "pattern": "^[0-9]{3}$"}, "abc", "123"),
    Probe("pattern (unanchored)", {"type": "string", "pattern": "[0-9]{3}"}, "abc", "123"),
    Probe("pattern (look-ahead)", {"type": "string", "pattern": "^(?=.*[0-9]).+$"}, "abc", "a1"),
    Probe("minimum", {"type": "integer", "minimum": 10}, 3, 12),
    Probe("maximum", {"type": "integer", "maximum": 20}, 99, 12),
    Probe("multipleOf", {"type": "number", "multipleOf": 3}, 4, 6),
    Probe("minItems", {"type": "array", "items": {"type": "string"}, "minItems": 2}, ["x"], ["x", "y"]),
    Probe("maxItems", {"type": "array", "items": {"type": "string"}, "maxItems": 2}, ["x", "y", "z", "w"], ["x"]),
    Probe("format (date)", {"type": "string", "format": "date"}, "yesterday", "2026-11-01"),
    Probe("format (email)", {"type": "string", "format": "email"}, "nobody", "a@b.org"),
    Probe("nested object", _obj({"b": {"type": "integer"}}, additionalProperties=False), {"b": "no"}, {"b": 1}),
    Probe("array items", {"type": "array", "items": {"type": "integer"}}, ["x"], [1]),
]


def schema_of(probe: Probe) -> dict[str, Any]:
    if probe.whole:
        return probe.schema
    return _obj({"a": probe.schema}, additionalProperties=False)


def answer(probe: Probe, value: Any) -> dict[str, Any]:
    return value if probe.whole else {"a": value}


def compact(value: Any) -> str:
    """JSON as the providers' compact grammars write it (one space after ',' and ':')."""
    return json.dumps(value, ensure_ascii=False)


def breaks_rule(probe: Probe, text: str) -> bool | None:
    """Whether an answer breaks the probe's schema; None when it is not JSON at all (says nothing of the rule)."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError:
        return None
    cls = jsonschema.Draft202012Validator
    return not cls(schema_of(probe), format_checker=cls.FORMAT_CHECKER).is_valid(value)


# -- xgrammar --------------------------------------------------------------------------------------------------------

def measure_xgrammar() -> dict[str, str]:
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    out = {}
    for probe in PROBES:
        grammar = xgr.Grammar.from_json_schema(json.dumps(schema_of(probe)), any_whitespace=False)
        keeps = _is_grammar_accept_string(grammar, compact(answer(probe, probe.keeps)))
        breaks = _is_grammar_accept_string(grammar, compact(answer(probe, probe.breaks)))
        out[probe.keyword] = ("enforced" if keeps and not breaks else "not enforced" if breaks
                              else "refuses valid answers")
    return out


# -- llama.cpp's server ----------------------------------------------------------------------------------------------

def measure_llama_grammar() -> dict[str, str]:
    import xgrammar as xgr
    from llama_cpp.llama_grammar import json_schema_to_gbnf
    from xgrammar.testing import _is_grammar_accept_string

    out = {}
    for probe in PROBES:
        try:
            gbnf = json_schema_to_gbnf(json.dumps(schema_of(probe)))
        except Exception as exc:  # noqa: BLE001 - what the server does then is the finding
            out[probe.keyword] = f"whole schema dropped ({exc})"
            continue
        grammar = xgr.Grammar.from_ebnf(gbnf)
        keeps = _is_grammar_accept_string(grammar, compact(answer(probe, probe.keeps)))
        breaks = _is_grammar_accept_string(grammar, compact(answer(probe, probe.breaks)))
        out[probe.keyword] = ("enforced" if keeps and not breaks else "not enforced" if breaks
                              else "refuses valid answers")
    return out


def _chat(base_url: str, prompt: str, response_format: dict[str, Any] | None) -> str:
    body: dict[str, Any] = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}],
                            "temperature": 0, "max_tokens": 60}
    if response_format is not None:
        body["response_format"] = response_format
    request = urllib.request.Request(base_url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"] or ""


PROMPTS = (
    "Copy this JSON exactly, character for character, and output nothing else:\n{answer}",
    "Output exactly this JSON and nothing else:\n{answer}",
    "Repeat the following JSON verbatim:\n{answer}",
)


def measure_llama(base_url: str) -> tuple[dict[str, str], dict[str, Any]]:
    results, evidence = {}, {}
    for probe in PROBES:
        text = compact(answer(probe, probe.breaks))
        schema = schema_of(probe)
        free = [_chat(base_url, p.format(answer=text), None) for p in PROMPTS]
        held = [_chat(base_url, p.format(answer=text), {"type": "json_object", "schema": schema}) for p in PROMPTS]
        free_broke = [breaks_rule(probe, t) for t in free]
        held_broke = [breaks_rule(probe, t) for t in held]
        if any(b is True for b in held_broke):
            verdict = "not enforced"
        elif any(b is True for b in free_broke) and all(b is False for b in held_broke):
            verdict = "enforced"
        else:
            verdict = "inconclusive"
        results[probe.keyword] = verdict
        evidence[probe.keyword] = {"schema": schema, "asked_to_copy": text, "unconstrained": free,
                                   "constrained": held}
    return results, evidence


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-url", help="a running llama.cpp server's /v1 URL (default: start one)")
    parser.add_argument("--json", help="write the verdicts and the raw answers to this file")
    args = parser.parse_args()
    with llama_base_url(args.llama_url) as base_url:
        xgrammar = measure_xgrammar()
        grammar = measure_llama_grammar()
        llama, evidence = measure_llama(base_url)
    print(f"{'keyword':26} {'xgrammar 0.2.8':15} {'llama.cpp server':17} llama.cpp grammar")
    for probe in PROBES:
        print(f"{probe.keyword:26} {xgrammar[probe.keyword]:15} {llama[probe.keyword]:17} {grammar[probe.keyword]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"xgrammar": xgrammar, "llama.cpp server": llama,
                                               "llama.cpp grammar": grammar, "evidence": evidence},
                                              indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
