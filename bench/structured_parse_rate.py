"""How many of SmolLM2's structured answers through llama.cpp's server parse and are valid: before (the request and
the check main b25b11d made) and after (this product: objects closed, patterns anchored, duplicate keys and formats
checked). The figures in docs/structured-outputs.md come from this script.

    .venv/bin/python bench/structured_parse_rate.py [--rows 100] [--llama-url http://127.0.0.1:PORT/v1]

Rows: the first N companies of the `customers` sample (batch_assets/sample_data.py, seed 0), temperature
0. Three schemas: `industry` (one enum field, the customer_industry task written as a JSON schema), `enrichment`
(typed columns as a user enriches companies: an enum, a capped string, an unanchored pattern, a bounded integer)
and `enrichment_anchored` (the same, its pattern written ^...$).
- before: `{"type": "json_object", "schema": <schema as written>}`, checked with `json.loads` (a repeated key: the
  last one wins) and `jsonschema` without formats: what main sent and accepted.
- after: the response_format the product's provider builds now (plan_request), checked by `validate_output`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: tests.resources.openai_api.llama_server
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: common, script_io (also when imported by a test)
from common import llama_base_url  # noqa: E402

LABELS = ["Law Firm", "Healthcare", "Technology", "Retail", "Consulting", "Manufacturing", "Finance", "Real Estate",
          "Other"]
SCHEMAS = {
    "industry": (
        {"type": "object", "properties": {"industry": {"type": "string", "enum": LABELS}}, "required": ["industry"]},
        "What industry is this company in: {company} ({city}, {country})? Answer in JSON.",
    ),
    "enrichment": (
        {"type": "object", "properties": {
            "industry": {"type": "string", "enum": LABELS},
            "summary": {"type": "string", "maxLength": 60},
            "ticker": {"type": "string", "pattern": "[A-Z]{1,5}"},
            "employees": {"type": "integer", "minimum": 1}},
         "required": ["industry", "summary", "ticker", "employees"]},
        "Company: {company} ({city}, {country}). Give its industry, a one-line summary, its stock ticker and its "
        "number of employees, as JSON.",
    ),
}
# The same with the pattern anchored, so llama.cpp's server builds a grammar for it before too: what is left is
# the effect of closing the objects.
SCHEMAS["enrichment_anchored"] = (
    {**SCHEMAS["enrichment"][0], "properties": {**SCHEMAS["enrichment"][0]["properties"],
                                                "ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}},
    SCHEMAS["enrichment"][1],
)
SYSTEM = "You describe companies. Answer only in JSON."


def _chat(base_url: str, prompt: str, response_format: dict[str, Any], max_tokens: int) -> tuple[str, str]:
    body = {"model": "smollm2", "temperature": 0, "max_tokens": max_tokens, "response_format": response_format,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]}
    request = urllib.request.Request(base_url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        choice = json.loads(resp.read())["choices"][0]
    return choice["message"]["content"] or "", choice.get("finish_reason") or ""


def _before_check(text: str, schema: dict[str, Any]) -> str:
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError:
        return "not JSON"
    return "valid" if jsonschema.Draft202012Validator(schema).is_valid(value) else "invalid"


def _duplicate_keys(text: str) -> bool:
    dup = [False]

    def hook(pairs: list) -> dict:
        keys = [k for k, _ in pairs]
        dup[0] = dup[0] or len(keys) != len(set(keys))
        return dict(pairs)

    try:
        json.loads(text, object_pairs_hook=hook)
    except ValueError:
        return False
    return dup[0]


def _extra_keys(text: str, schema: dict[str, Any]) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and bool(set(value) - set(schema["properties"]))


def main() -> None:
    from batch_assets.sample_data import _customers
    from batch_assets.resources.openai_api.payloads import plan_request
    from batch_assets.resources.protocols import GenerationParams
    from batch_assets.resources.structured import StructuredOutput, validate_output

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--llama-url")
    parser.add_argument("--schemas", default=",".join(SCHEMAS), help="comma-separated, of: " + ", ".join(SCHEMAS))
    parser.add_argument("--json", help="write every answer and verdict to this file")
    args = parser.parse_args()
    rows = _customers(random.Random(0), args.rows)
    report: dict[str, Any] = {}
    with llama_base_url(args.llama_url) as base_url:
        for name in args.schemas.split(","):
            schema, template = SCHEMAS[name]
            structured = StructuredOutput(json_schema=schema)
            params = GenerationParams(max_new_tokens=args.max_tokens, temperature=0,
                                      **structured.generation_constraints())
            after_format = plan_request(params, api="chat", backend="response_format",
                                        json_schema_mode="json_object_schema", max_tokens_param="max_tokens",
                                        extra_body={}, store_responses=False).kwargs["response_format"]
            before_format = {"type": "json_object", "schema": schema}
            counts: dict[str, Counter] = {"before": Counter(), "after": Counter()}
            answers = []
            for row in rows:
                prompt = template.format(**row)
                b_text, b_finish = _chat(base_url, prompt, before_format, args.max_tokens)
                a_text, a_finish = _chat(base_url, prompt, after_format, args.max_tokens)
                b = counts["before"]
                b["rows"] += 1
                b[_before_check(b_text, schema)] += 1
                b["duplicate keys"] += _duplicate_keys(b_text)
                b["extra keys"] += _extra_keys(b_text, schema)
                b["cut at max_tokens"] += b_finish == "length"
                b["valid (today's check)"] += validate_output(b_text, structured, b_finish)[1] is None
                a = counts["after"]
                a["rows"] += 1
                _, problem = validate_output(a_text, structured, a_finish)
                a["valid" if problem is None else "row error"] += 1
                a["parses as JSON"] += _before_check(a_text, schema) != "not JSON"
                a["duplicate keys"] += _duplicate_keys(a_text)
                a["extra keys"] += _extra_keys(a_text, schema)
                a["cut at max_tokens"] += a_finish == "length"
                answers.append({"id": row["customer_id"], "before": b_text, "after": a_text, "after_error": problem})
            report[name] = {"counts": {k: dict(v) for k, v in counts.items()}, "answers": answers}
            print(name, json.dumps(report[name]["counts"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
