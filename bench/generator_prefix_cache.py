"""Side by side, in one process: the transformers generator with and without the shared-prefix KV cache.

Same model weights, same prompts (the customer_industry system message + one company per row), alternating runs
so machine noise hits both. Prints seconds per run and the ratio; answers must be identical.

    .venv/bin/python bench/generator_prefix_cache.py [--rows 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from data import company_names
from batch_assets.resources.hf.generator import TransformersGenerator
from batch_assets.resources.protocols import GenerationParams

SYSTEM = ("You are a helpful assistant that infers company industries. Based on the company name provided, output "
          "only the industry category. Choose from: Law Firm, Healthcare, Technology, Retail, Consulting, "
          "Manufacturing, Finance, Real Estate, Other.")
LABELS = ("Law Firm", "Healthcare", "Technology", "Retail", "Consulting", "Manufacturing", "Finance", "Real Estate",
          "Other")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    convs = [[{"role": "system", "content": SYSTEM},
              {"role": "user", "content": f"What industry is this company in: {name}?"}]
             for name in company_names(args.rows)]
    cached = TransformersGenerator(batch_size=32, prefix_cache=True).load_for_tests()
    plain = TransformersGenerator(batch_size=32, prefix_cache=False)
    plain._model = cached._model
    for label, params in (("free text, 8 tokens", GenerationParams(max_new_tokens=8)),
                          ("choices (xgrammar)", GenerationParams(max_new_tokens=16, choices=LABELS))):
        times: dict[str, list[float]] = {"plain": [], "cached": []}
        answers: dict[str, list[str | None]] = {}
        for _ in range(args.repeats):
            for name, gen in (("plain", plain), ("cached", cached)):
                start = time.perf_counter()
                out = gen.generate(convs, params)
                times[name].append(time.perf_counter() - start)
                answers[name] = [g.text for g in out]
        p, c = statistics.median(times["plain"]), statistics.median(times["cached"])
        print(f"{label}: {args.rows} rows, median of {args.repeats}: plain {p:.1f}s ({args.rows / p:.1f} rows/s), "
              f"prefix cache {c:.1f}s ({args.rows / c:.1f} rows/s), speed-up {p / c:.2f}x, "
              f"identical answers: {answers['plain'] == answers['cached']}")


if __name__ == "__main__":
    main()
