"""Raw vLLM baseline: every prompt through one `LLM.generate` call (continuous batching), 16 new tokens, greedy.

    python bench/gpu/raw_vllm.py --input 'DIR/*.parquet'
"""

from __future__ import annotations

import argparse
import glob
import json
import time

START = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq
    from vllm import LLM, SamplingParams

    from batch_assets.resources.hf.models import smollm2_location

    folder, gguf = smollm2_location()
    llm = LLM(model=f"{folder}/{gguf}")
    table = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(args.input)))
    conversations = [[{"role": "user", "content": q}] for q in table.column("question").to_pylist()]
    t0, w0 = time.perf_counter(), time.time()
    outputs = llm.chat(conversations, SamplingParams(max_tokens=args.max_new_tokens, temperature=0))
    t1, w1 = time.perf_counter(), time.time()
    print("BENCH_RESULT " + json.dumps({"rows": len(outputs), "infer_s": t1 - t0, "total_s": t1 - START,
                                        "infer_window": [w0, w1]}))


if __name__ == "__main__":
    main()
