"""The stages around the model, without the model: read, prepare and write of a hash-sharded pipeline, timed
in one process. Measures the read-amplification and row-hash levers (docs/BENCHMARKS.md, "Levers").

    python bench/levers_stages.py --rows 40000 --shards 4 [--repeats 3]

Run it with the code before and after a change (e.g. from another worktree) on the same machine, back to back.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from data import write_documents


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from batch_assets.orchestration.assets import factory
    from batch_assets.partitions import hash_shard_keys
    from batch_assets.spec import parse_spec
    from batch_assets.stages import prepare, read, write
    from batch_assets.storage import ArrowStorage

    tmp = Path(tempfile.mkdtemp(prefix="bench-stages-"))
    write_documents(tmp / "docs", args.rows)
    spec = parse_spec({
        "name": "stages", "source": {"format": "parquet", "path": str(tmp / "docs" / "*.parquet"),
                                     "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "hash", "count": args.shards},
        "prepare": {"id_column": "doc_id", "text_column": "text"},
        "task": {"kind": "embed"}, "model": {"provider": "sentence_transformers"},
        "sink": {"path": str(tmp / "out")},
    })
    storage = ArrowStorage(root=str(tmp / "store"))
    keys = hash_shard_keys(args.shards)
    read_many = getattr(read, "run_read_shards", None)
    times: dict[str, list[float]] = {"read": [], "prepare": [], "write": []}
    for _ in range(args.repeats):
        shutil.rmtree(tmp / "store", ignore_errors=True)
        t0 = time.perf_counter()
        if read_many is not None:
            read_many(spec, storage, keys)
        else:
            for k in keys:
                read.run_read(spec, storage, k)
        t1 = time.perf_counter()
        for k in keys:
            prepare.run_prepare(spec, storage, k)
        t2 = time.perf_counter()
        for k in keys:  # the model's output is not the point here: `inferred` = `prepared`
            src = Path(storage.stage_url(spec.name, "prepared", k))
            dst = Path(storage.stage_url(spec.name, "inferred", k))
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
        t3 = time.perf_counter()
        for k in keys:
            write.run_write(spec, storage, k)
        t4 = time.perf_counter()
        times["read"].append(t1 - t0)
        times["prepare"].append(t2 - t1)
        times["write"].append(t4 - t3)
    del factory
    shutil.rmtree(tmp, ignore_errors=True)
    out = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out.update(rows=args.rows, shards=args.shards, repeats=args.repeats,
               shared_read=read_many is not None)
    print("BENCH_RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
