"""Peak memory of the four stages at 1x and 10x the rows of a partition: does memory grow with the partition?

Each size runs in a fresh child process (so peaks do not mix): read -> prepare -> infer -> write of one partition
through the real stage functions (`run_read`, `run_prepare`, `run_infer`, `run_write`) with the `custom` provider and a
dependency-free model (text length), so what is measured is the pipeline's own memory, not a model's. The child
reports, per stage, the peak RSS (`ru_maxrss`, the whole process: Arrow buffers, numpy, Python) and the peak of
Python/numpy allocations (`tracemalloc`, where a Python set of every row id would show). Source data is written by the
parent before the child starts.

Run: `.venv/bin/python bench/memory_rss.py --rows 20000 --factor 10`
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["the moon orbits the earth", "pasta needs salted water and patience", "stocks fell on monday",
         "the goalkeeper saved it in the last minute of the match"]


def write_source(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"doc_id": f"doc-{i:09d}", "text": f"{TEXTS[i % 4]} #{i}"}) + "\n")


def spec_dict(data: Path) -> dict:
    return {
        "name": "memory",
        "source": {"format": "jsonl", "path": f"{data}/{{partition}}.jsonl", "columns": ["doc_id", "text"],
                   "batch_rows": 2048},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "input_columns": ["text"]},
        "task": {"kind": "predict", "output_column": "length"},
        "model": {"provider": "custom", "config": {"class_path": "bench.memory_rss:TextLength"}},
        "runtime": {"chunk_rows": 512},
    }


class TextLength:
    def __call__(self, batch):
        return [len(t or "") for t in batch["text"]]


def child(data: str, store: str, trace: bool) -> None:
    """Runs in the child process: the four stages, one peak per stage."""
    import resource
    import tracemalloc

    import dagster as dg

    from batch_assets.orchestration.assets.factory import build_model_resource
    from batch_assets.spec import parse_spec
    from batch_assets.stages.infer import InferStats, run_infer
    from batch_assets.stages.prepare import run_prepare
    from batch_assets.stages.read import run_read
    from batch_assets.stages.write import run_write
    from batch_assets.storage import ArrowStorage

    spec = parse_spec(spec_dict(Path(data)))
    storage = ArrowStorage(root=store)
    out = {"baseline_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with dg.build_resources({"model": build_model_resource(spec)}) as res:
        stages = [("read", lambda: run_read(spec, storage, "a")), ("prepare", lambda: run_prepare(spec, storage, "a")),
                  ("infer", lambda: run_infer(spec, storage, "a", res.model, InferStats())),
                  ("write", lambda: run_write(spec, storage, "a"))]
        for name, stage in stages:
            if trace:
                tracemalloc.start()
            report = stage()
            if trace:
                out[f"{name}_python_peak_kb"] = tracemalloc.get_traced_memory()[1] / 1024
                tracemalloc.stop()
            out[f"{name}_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out[f"{name}_rows"] = report.rows_out
    print("RESULT " + json.dumps(out))


def measure(rows: int, workdir: Path, trace: bool = False) -> dict:
    data = workdir / f"data-{rows}"
    write_source(data / "a.jsonl", rows)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(data), str(workdir / f"store-{rows}")] + (["--trace"] if trace else []),
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=1800,
    )
    if proc.returncode:
        raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-3000:])
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return {"rows": rows, **json.loads(line.removeprefix("RESULT "))}


def compare(rows: int, factor: int, trace: bool = False) -> tuple[dict, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        return measure(rows, Path(tmp), trace), measure(rows * factor, Path(tmp), trace)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--factor", type=int, default=10)
    parser.add_argument("--trace", action="store_true", help="also the tracemalloc peak per stage (slower)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, trace=args.trace)
        return
    small, large = compare(args.rows, args.factor, args.trace)
    print(f"| stage | peak RSS at {small['rows']:,} rows | at {large['rows']:,} rows | ratio |")
    print("|---|---|---|---|")
    for stage in ("read", "prepare", "infer", "write"):
        a, b = small[f"{stage}_rss_mb"], large[f"{stage}_rss_mb"]
        print(f"| {stage} (cumulative peak) | {a:.0f} MB | {b:.0f} MB | {b / a:.2f}x |")
        if args.trace:
            a, b = small[f"{stage}_python_peak_kb"], large[f"{stage}_python_peak_kb"]
            print(f"| {stage} Python/numpy peak | {a:.0f} KB | {b:.0f} KB | {b / a:.2f}x |")
    print(f"baseline RSS after imports: {small['baseline_rss_mb']:.0f} MB / {large['baseline_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
