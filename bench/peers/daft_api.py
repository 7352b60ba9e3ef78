"""Daft: read_parquet -> prompt (openai provider pointed at the loopback benchmark server) -> write_parquet.

    bench/.venv-peers/bin/python bench/peers/daft_api.py --input 'DIR/*.parquet' --output OUT_DIR --base-url URL
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
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    import daft
    from daft.ai.openai.provider import OpenAIProvider
    from daft.functions import prompt

    provider = OpenAIProvider(name="bench", base_url=args.base_url, api_key="bench")
    t_import = time.perf_counter()
    df = daft.read_parquet(args.input)
    # Daft's default is the Responses API; the benchmark server (like most compatible servers) speaks chat.
    df = df.with_column("generated_text", prompt(daft.col("question"), provider=provider, model="bench",
                                                 use_chat_completions=True, max_tokens=args.max_new_tokens,
                                                 temperature=0))
    df.write_parquet(args.output)
    t_done = time.perf_counter()
    report(import_s=t_import - START, total_s=t_done - START)


if __name__ == "__main__":
    main()
