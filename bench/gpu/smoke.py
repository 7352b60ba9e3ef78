"""A tiny `dagster asset materialize` of our embedding and generation pipelines (one partition, a few rows each),
before bench/gpu/gpu_bench.py spends minutes: a missing wheel, a model folder that does not load or a device that
does not work shows here in seconds, with the end of the run's log.

    python3 bench/gpu/smoke.py     # BENCH_GPU_DEVICE (default cuda), BENCH_EMBED_MODEL, BENCH_GENERATE_MODEL
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ours  # noqa: E402
from common import WORK, log  # noqa: E402
from data import write_documents, write_prompts  # noqa: E402


def main() -> int:
    device = os.environ.get("BENCH_GPU_DEVICE", "cuda")
    keys = ["part-0"]
    docs, prompts = WORK / "data" / "smoke-docs", WORK / "data" / "smoke-prompts"
    write_documents(docs, 32, files=1)
    write_prompts(prompts, 8, files=1)
    failed = 0
    for name, spec in (("embed", ours.embed_spec("gpu_smoke_embed", docs, keys, device=device)),
                       ("generate", ours.generate_spec("gpu_smoke_generate", prompts, keys, device=device))):
        run = ours.materialize(spec, keys)
        if run.rc == 0:
            log(f"smoke {name}: ok, {run.wall_s:.1f} s whole process, infer step {run.result.get('inferred_s')} s")
        else:
            failed += 1
            log(f"smoke {name}: FAILED (rc {run.rc}) after {run.wall_s:.1f} s, log {run.log_path}; its end:\n"
                f"{run.log_tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
