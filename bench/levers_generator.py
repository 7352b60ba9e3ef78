"""The generation levers, measured in one process on the real SmolLM2 weights:

1. the per-batch copy of the shared prefix cache: deep copy + repeat_interleave (before) vs one broadcast copy
   into a fresh cache (after), timed alone;
2. stop strings: the generator's whole `generate` call with `stop` set, run with the code on the path. Run it
   once with the code before the change and once after (e.g. `cd <old worktree> && python <this file>`).

    python bench/levers_generator.py [--rows 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

from data import company_names

SYSTEM = "You are a concise assistant. Answer in one short sentence."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch
    from transformers import DynamicCache

    from batch_assets.resources.hf.generator import TransformersGenerator
    from batch_assets.resources.protocols import GenerationParams

    gen = TransformersGenerator(batch_size=32).load_for_tests()
    convs = [[{"role": "system", "content": SYSTEM},
              {"role": "user", "content": f"Describe {name} and its industry."}] for name in company_names(args.rows)]
    ids = gen.encode_prompts(convs)
    prefix, cache = gen.shared_prefix(ids)

    def deep(n: int):
        c = copy.deepcopy(cache)
        c.batch_repeat_interleave(n)
        return c

    def broadcast(n: int):
        layers = [(k.expand(n, *k.shape[1:]), v.expand(n, *v.shape[1:])) for k, v, *_ in cache]
        return DynamicCache(ddp_cache_data=layers, config=gen.loaded.model.config)

    cache_times = {}
    for name, fn in (("deepcopy", deep), ("broadcast", broadcast)):
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            fn(32)
            ts.append(time.perf_counter() - t)
        cache_times[name] = statistics.median(ts) * 1000
    a, b = deep(4), broadcast(4)
    same = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))

    params = GenerationParams(max_new_tokens=32, stop=(".",))
    times, tokens = [], 0
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = gen.generate(convs, params)
        times.append(time.perf_counter() - t)
        tokens = sum(g.completion_tokens or 0 for g in out)
    print("BENCH_RESULT " + json.dumps({
        "prefix_tokens": len(prefix), "cache_copy_ms_deepcopy": round(cache_times["deepcopy"], 2),
        "cache_copy_ms_broadcast": round(cache_times["broadcast"], 2), "caches_equal": same,
        "generate_s": round(statistics.median(times), 2), "completion_tokens": tokens, "rows": args.rows,
        "texts_sample": [g.text for g in out[:3]]}))


if __name__ == "__main__":
    main()
