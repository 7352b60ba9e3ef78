"""Ray Data LLM: read_parquet -> HttpRequestProcessorConfig processor (at its defaults, or with --concurrency /
--batch-size) against the loopback benchmark server -> write_parquet.

    bench/.venv-peers/bin/python bench/peers/ray_api.py --input 'DIR/*.parquet' --output OUT_DIR --url URL
"""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


def main() -> None:
    ap = arguments()
    ap.add_argument("--url", required=True, help="the chat completions URL")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=0, help="0: the processor's default")
    ap.add_argument("--batch-size", type=int, default=0, help="0: the processor's default")
    args = ap.parse_args()
    import ray
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    t_import = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    options = {}
    if args.concurrency:
        options["concurrency"] = args.concurrency
    if args.batch_size:
        options["batch_size"] = args.batch_size
    config = HttpRequestProcessorConfig(url=args.url, headers={"Authorization": "Bearer bench"}, **options)
    tokens = args.max_new_tokens
    processor = build_processor(
        config,
        preprocess=lambda row: {"payload": {"model": "bench", "max_tokens": tokens, "temperature": 0,
                                            "messages": [{"role": "user", "content": row["question"]}]}},
        postprocess=lambda row: {"prompt_id": row["prompt_id"],
                                 "generated_text": row["http_response"]["choices"][0]["message"]["content"]},
    )
    processor(ray.data.read_parquet(sorted(glob.glob(args.input)))).write_parquet(args.output)
    t_done = time.perf_counter()
    ray.shutdown()
    report(import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
