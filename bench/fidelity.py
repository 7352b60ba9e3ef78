"""How close two runs' embeddings are, joined by row id: recall@10 of each row's nearest neighbours (cosine, itself
left out) and the cosine of each pair of vectors. The embed section compares the fast mode's output with the raw
script's (torch, float32) on the benchmark's own documents.

    .venv/bin/python bench/fidelity.py --exact OUT.parquet --other 'DIR/**/*.parquet' [--id doc_id]
"""

from __future__ import annotations

import argparse
import glob
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def vectors(pattern: str, id_column: str, column: str = "embedding") -> tuple[list[str], np.ndarray]:
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        raise FileNotFoundError(f"no Parquet file matches {pattern}")
    table = pa.concat_tables(pq.read_table(f, columns=[id_column, column]) for f in files)
    flat = table.column(column).combine_chunks()
    return table.column(id_column).to_pylist(), np.asarray(flat.flatten().to_numpy(zero_copy_only=False),
                                                           dtype=np.float32).reshape(len(table), -1)


def neighbours(unit: np.ndarray, k: int, block: int = 1024) -> np.ndarray:
    out = np.empty((len(unit), k), dtype=np.int64)
    for start in range(0, len(unit), block):
        sims = unit[start:start + block] @ unit.T
        sims[np.arange(len(sims)), np.arange(start, start + len(sims))] = -np.inf  # not itself
        out[start:start + block] = np.argpartition(-sims, k, axis=1)[:, :k]
    return out


def compare(exact_ids: list[str], exact: np.ndarray, other_ids: list[str], other: np.ndarray, k: int = 10) -> dict:
    where = {row_id: i for i, row_id in enumerate(other_ids)}
    if sorted(where) != sorted(exact_ids):
        raise ValueError("the two outputs do not hold the same row ids")
    other = other[[where[row_id] for row_id in exact_ids]]
    unit_a = exact / np.linalg.norm(exact, axis=1, keepdims=True)
    unit_b = other / np.linalg.norm(other, axis=1, keepdims=True)
    cos = (unit_a * unit_b).sum(axis=1)
    a, b = neighbours(unit_a, k), neighbours(unit_b, k)
    hits = sum(len(np.intersect1d(x, y, assume_unique=True)) for x, y in zip(a, b))
    return {"rows": len(exact_ids), f"recall_at_{k}": round(hits / (k * len(a)), 4),
            "min_cosine": round(float(cos.min()), 6), "mean_cosine": round(float(cos.mean()), 6)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--exact", required=True)
    ap.add_argument("--other", required=True)
    ap.add_argument("--id", default="doc_id")
    args = ap.parse_args()
    print(json.dumps(compare(*vectors(args.exact, args.id), *vectors(args.other, args.id))))


if __name__ == "__main__":
    main()
