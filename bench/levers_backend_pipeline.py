"""Our embedding pipeline (the real CLI, whole process) with each `backend` pinned, interleaved: whole-process
seconds and the infer step's own seconds, on the embed section's documents (bench/work/data/docs-N).

    flock /tmp/bench.lock .venv/bin/python bench/levers_backend_pipeline.py [--docs 4000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ours  # noqa: E402
from common import WORK  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backends", default="openvino,onnx,torch")
    args = ap.parse_args()
    data = WORK / "data" / f"docs-{args.docs}"
    backends = args.backends.split(",")
    whole: dict[str, list[float]] = {b: [] for b in backends}
    infer: dict[str, list[float]] = {b: [] for b in backends}
    for r in range(args.repeats):
        for b in backends[r % len(backends):] + backends[:r % len(backends)]:
            spec = ours.embed_spec(f"bench_backend_{b}", data, ours.KEYS)
            spec["model"]["config"]["backend"] = b
            run = ours.materialize(spec, ours.KEYS, label=f"-{r}")
            whole[b].append(run.wall_s)
            infer[b].append(ours.run_metrics(spec["name"])["inferred_s"])
            print(b, round(run.wall_s, 1), round(infer[b][-1], 1), os.getloadavg(), flush=True)
    print(f"{args.docs} documents, median of {args.repeats}, load average at end {os.getloadavg()}")
    print("| backend | whole process s | infer step s |")
    print("|---|---:|---:|")
    for b in backends:
        print(f"| {b} | {statistics.median(whole[b]):.1f} | {statistics.median(infer[b]):.1f} |")


if __name__ == "__main__":
    main()
