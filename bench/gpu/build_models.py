"""Random-weight models with the shapes of the two shipped ones, for a GPU machine that has neither package (the
lent device has no network, and MiniLM's 90 MB and SmolLM2's 270 MB do not fit what travels there).

    python3 bench/gpu/build_models.py --tokenizers .gpu/models --out /tmp/bench-models

`--tokenizers` holds, per model, everything but the weights, copied from the packages in a working .venv:
`minilm/` (all-MiniLM-L6-v2's sentence-transformers folder: config, tokenizer, modules.json, 1_Pooling) and
`smollm2/` (SmolLM2-135M-Instruct's LlamaConfig and tokenizer with its ChatML template, both read from the GGUF).
Writes `OUT/minilm` (BertModel, 6 layers, 384 hidden, mean pooling, normalized) and `OUT/smollm2`
(LlamaForCausalLM, 30 layers, 576 hidden), then checks each loads and runs; prints the two folders for
BENCH_EMBED_MODEL / BENCH_GENERATE_MODEL.

Random weights time the same work as the real ones (same shapes, same tokens in and out), which is all the GPU
bench measures: raw and ours read the same folder. Their outputs mean nothing. A random LM would emit
end-of-sequence at random, and a batch stops early when all of its rows have: so the generation config suppresses
the end-of-sequence tokens, and every row of raw and ours alike generates exactly max_new_tokens.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def build_minilm(src: Path, out: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_pretrained(out))
    model.save_pretrained(out)

    from sentence_transformers import SentenceTransformer

    vectors = SentenceTransformer(str(out), device="cpu").encode(["a check sentence", "another one"])
    norms = [float((v**2).sum() ** 0.5) for v in vectors]
    if vectors.shape != (2, 384) or not all(abs(n - 1) < 1e-3 for n in norms):
        raise SystemExit(f"MiniLM-shaped model at {out}: expected 2 normalized 384-dim vectors, got shape "
                         f"{vectors.shape}, norms {norms}")


def build_smollm2(src: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out)
    tokenizer = _tokenizer(out, AutoTokenizer)
    config = LlamaConfig.from_pretrained(out)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    eos = sorted({i for i in (config.eos_token_id, tokenizer.eos_token_id) if i is not None})
    # never end early: random weights would stop rows (and whole batches) at random, and raw and ours differently
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos,
                                               pad_token_id=tokenizer.pad_token_id, suppress_tokens=eos)
    model.save_pretrained(out)

    loaded = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer.padding_side = "left"  # as raw and ours generate
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         tokenize=False)
    batch = tokenizer([text, text + " more"], return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        ids = loaded.generate(**batch, max_new_tokens=12, do_sample=False, temperature=None, top_p=None,
                              top_k=None, pad_token_id=tokenizer.pad_token_id)
    new = ids[:, batch["input_ids"].shape[1]:]
    if new.shape[1] != 12 or any(int(t) in eos for t in new.flatten()):
        raise SystemExit(f"SmolLM2-shaped model at {out}: expected 12 new tokens per row and no end-of-sequence, "
                         f"got {new.tolist()}")


def _tokenizer(folder: Path, auto: type) -> object:
    """The tokenizer as saved by a newer transformers (tokenizer_class TokenizersBackend); where this transformers
    does not know that class, the same tokenizer.json read as PreTrainedTokenizerFast."""
    try:
        return auto.from_pretrained(folder)
    except (ValueError, AttributeError, ImportError) as exc:
        path = folder / "tokenizer_config.json"
        cfg = json.loads(path.read_text())
        print(f"build_models: {exc!r}; reading {path} as PreTrainedTokenizerFast", file=sys.stderr)
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(cfg, indent=2))
        return auto.from_pretrained(folder)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True, type=Path, help="folder with minilm/ and smollm2/ (no weights)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    for name, build in (("minilm", build_minilm), ("smollm2", build_smollm2)):
        start = time.perf_counter()
        src = args.tokenizers / name
        if not (src / "config.json").is_file():
            raise SystemExit(f"{src}/config.json is missing: copy the model's files without weights there "
                             "(docs/BENCHMARKS.md, GPU section)")
        build(src, args.out / name)
        print(f"build_models: {name} at {args.out / name} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    print(f"BENCH_EMBED_MODEL={args.out / 'minilm'}")
    print(f"BENCH_GENERATE_MODEL={args.out / 'smollm2'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
