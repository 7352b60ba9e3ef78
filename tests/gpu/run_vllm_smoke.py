"""Smoke test of VLLMEngineProvider on a real GPU with the real vLLM engine (not runnable on CPU machines).

    python tests/gpu/run_vllm_smoke.py [--model Qwen/Qwen2.5-0.5B-Instruct] [--embed-model BAAI/bge-small-en-v1.5]

Checks, through the provider exactly as a pipeline uses it: choice-constrained generation (every row one of the
labels), JSON-schema generation (every finished row parses and validates), prefix-ordered chunks mapped back to
their rows, and embeddings from a pooling model. Prints a JSON report; exits 1 if a check fails, 2 if this machine
has no CUDA or no vLLM. See tests/gpu/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere without installing the project

from batch_assets.resources.protocols import GenerationParams  # noqa: E402
from batch_assets.resources.structured import StructuredOutput, validate_output  # noqa: E402
from batch_assets.resources.vllm_engine import VLLMEngineProvider  # noqa: E402

LABELS = ("positive", "negative", "neutral")
REVIEWS = [
    "Absolutely loved it, would buy again.",
    "Broke after two days. Waste of money.",
    "It arrived on Tuesday.",
    "Best purchase of the year!",
    "Terrible customer service, never again.",
    "Does what it says.",
    "Screen cracked in the box.",
    "Okay for the price.",
]
SYSTEM = "Classify the sentiment of the customer review. Answer with one word: positive, negative or neutral."
COMPANY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "industry": {"type": "string", "enum": ["Finance", "Retail", "Technology", "Other"]},
        "employees": {"type": "integer"},
    },
    "required": ["name", "industry", "employees"],
}


def gpu_unavailable_reason() -> str | None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vLLM is not installed (pip install 'batch-assets[vllm]' on a CUDA node)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device is visible to this process"
    return None


def check_generation(provider: VLLMEngineProvider, rows: int) -> dict[str, Any]:
    """Run choice and JSON generation through the provider; return a report with a list of failures."""
    failures: list[str] = []
    conversations = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": REVIEWS[i % len(REVIEWS)]}]
        for i in range(rows)
    ]
    start = time.perf_counter()
    results = provider.generate(conversations, GenerationParams(max_new_tokens=8, choices=LABELS))
    choice_seconds = time.perf_counter() - start
    if len(results) != rows:
        failures.append(f"choices: {len(results)} results for {rows} rows")
    for i, r in enumerate(results):
        if r.error is not None or r.text not in LABELS:
            failures.append(f"choices row {i}: text={r.text!r} error={r.error!r}")
    # Prefix ordering must not move answers between rows: rows that ask for a given word (under two interleaved
    # system prompts, so the engine's order differs from ours) must get that word back. A small model may slip on
    # a row or two; rows mixed up would agree only about a third of the time.
    systems = ["You are a careful assistant.", "You repeat words exactly."]
    expected = [LABELS[i % len(LABELS)] for i in range(rows)]
    copy_rows = [
        [
            {"role": "system", "content": systems[i % 2]},
            {"role": "user", "content": f"Reply with exactly this word: {w}"},
        ]
        for i, w in enumerate(expected)
    ]
    copied = provider.generate(copy_rows, GenerationParams(max_new_tokens=8, choices=LABELS))
    agree = sum(r.text == w for r, w in zip(copied, expected)) / rows
    if agree < 0.9:
        failures.append(f"only {agree:.0%} of rows answered the word they asked for: rows mapped back wrongly?")

    companies = ["Acme Bank", "Corner Grocer", "Quantum Widgets", "Nordic Timber"]
    json_rows = [
        [{"role": "user", "content": f"Describe the company {name} as JSON with name, industry and employees."}]
        for name in companies
    ]
    structured = StructuredOutput(json_schema=COMPANY)
    json_results = provider.generate(json_rows, GenerationParams(max_new_tokens=96, json_schema=COMPANY))
    for name, r in zip(companies, json_results):
        value, problem = validate_output(r.text, structured)
        if r.error is not None or problem is not None or r.parsed != value:
            failures.append(f"json {name}: text={r.text!r} error={r.error!r} problem={problem!r}")
    return {
        "rows": rows,
        "choice_seconds": round(choice_seconds, 3),
        "rows_answering_their_own_word": agree,
        "label_counts": {label: sum(r.text == label for r in results) for label in LABELS},
        "json_samples": [r.text for r in json_results[:2]],
        "failures": failures,
    }


def check_embeddings(provider: VLLMEngineProvider) -> dict[str, Any]:
    import numpy as np

    texts = ["A cat sat on the mat.", "A kitten was sitting on a rug.", "Quarterly revenue rose by 4 percent."]
    vectors = provider.embed(texts)
    failures: list[str] = []
    if vectors.shape[0] != 3 or vectors.ndim != 2 or not np.isfinite(vectors).all():
        failures.append(f"embeddings: bad array of shape {vectors.shape}")
    else:
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        near, far = float(unit[0] @ unit[1]), float(unit[0] @ unit[2])
        if not near > far:
            failures.append(f"embeddings: cat/kitten similarity {near:.3f} is not above cat/revenue {far:.3f}")
    return {"shape": list(vectors.shape), "failures": failures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--embed-model", default="BAAI/bge-small-en-v1.5", help="'' to skip embeddings")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="each engine's share")
    args = parser.parse_args()

    reason = gpu_unavailable_reason()
    if reason:
        print(json.dumps({"skipped": reason}))
        return 2
    report: dict[str, Any] = {}
    generator = VLLMEngineProvider(
        model=args.model, runner="generate", max_model_len=2048, gpu_memory_utilization=args.gpu_memory_utilization
    )
    start = time.perf_counter()
    generator.load_for_tests()
    report["generate"] = {"load_seconds": round(time.perf_counter() - start, 1), **generator.describe()}
    report["generate"].update(check_generation(generator, args.rows))
    if args.embed_model:
        embedder = VLLMEngineProvider(
            model=args.embed_model, runner="pooling", gpu_memory_utilization=args.gpu_memory_utilization
        ).load_for_tests()
        report["embed"] = {"model": args.embed_model, **check_embeddings(embedder)}
    print(json.dumps(report, indent=2, default=str))
    failed = [f for part in report.values() for f in part.get("failures", [])]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
