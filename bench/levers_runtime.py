"""The runtimes of the sentence-transformers provider side by side, in one process, interleaved: torch
(sentence-transformers' `encode`), onnxruntime and OpenVINO on the cached ONNX export (resources/hf/onnx_export.py),
and the length-sorting lever (one call over all rows vs 512-row calls). Prints seconds, rows/s, the ratio to torch and
the min cosine of each one's vectors against torch's, on the benchmark's documents (bench/data.py).

    flock /tmp/bench.lock .venv/bin/python bench/levers_runtime.py [--rows 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from data import _doc  # noqa: E402

from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder  # noqa: E402
from batch_assets.resources.hf.onnx_encoder import min_cosine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=512)
    args = ap.parse_args()
    rng = random.Random(7)
    texts = [_doc(rng) for _ in range(args.rows)]
    models = {name: SentenceTransformerEmbedder(device="cpu", backend=name).load_for_tests()
              for name in ("torch", "onnx", "openvino")}

    def chunked(model: SentenceTransformerEmbedder) -> np.ndarray:
        return np.concatenate([model.embed(texts[i:i + args.chunk]) for i in range(0, len(texts), args.chunk)])

    variants = {f"{name} ({args.chunk}-row calls)": (lambda m=m: chunked(m)) for name, m in models.items()}
    variants["openvino (one call)"] = lambda: models["openvino"].embed(texts)
    reference = variants[f"torch ({args.chunk}-row calls)"]()
    times: dict[str, list[float]] = {k: [] for k in variants}
    cosines = {k: min_cosine(f(), reference) for k, f in variants.items()}
    names = list(variants)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times[names[0]])
    print(f"{args.rows} documents, median of {args.repeats}, load average {os.getloadavg()}")
    print("| variant | median s | rows/s | ÷ torch time | min cosine to torch |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        t = statistics.median(times[name])
        print(f"| {name} | {t:.2f} | {args.rows / t:.0f} | {base / t:.2f}x | {cosines[name]:.7f} |")


if __name__ == "__main__":
    main()
