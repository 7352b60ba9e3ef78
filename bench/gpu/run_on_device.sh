#!/usr/bin/env bash
# The GPU bench on a lent machine that has python3 with torch/transformers/sentence-transformers but no network, no
# dagster and no model packages (docs/BENCHMARKS.md, "GPU"), in one command from the repository root:
#
#   bash bench/gpu/run_on_device.sh        # the carried folder .gpu/ holds wheels/ and models/ (tokenizers, configs)
#
# Steps, each under its own time limit and announced with "=== step": the carried wheels and our own package
# (pip install . from this tree, so it is the merged code) into /tmp/site; random-weight models of MiniLM's and
# SmolLM2's shapes (build_models.py); a tiny materialize of each pipeline (smoke.py, stops here if it fails); then
# gpu_bench.py with what time is left. Everything printed goes to $OUT/run.log too, and on exit (also after a
# failure or time-out) $OUT gets gpu.json and the last part of each run's log: at most 8 files, none in subfolders.
#
# Knobs: BENCH_DOCS (100000), BENCH_PROMPTS (2048), BENCH_REPEATS (2), GPU_TOTAL_S (seconds for the whole script,
# 540: the device command's limit less a margin), GPU_CARRY (.gpu), GPU_PYTHON (python3), GPU_SITE (/tmp/site),
# GPU_MODELS (/tmp/bench-models), GPU_REUSE_MODELS (1: keep models built by an earlier run).
# Locally, to prove the scripts without a GPU: GPU_SKIP_INSTALL=1 (use the venv's
# packages) GPU_PYTHON=.venv/bin/python BENCH_GPU_DEVICE=cpu BENCH_DOCS=64 BENCH_PROMPTS=8 BENCH_REPEATS=1.
set -uo pipefail

cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/bench/work/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

START=$SECONDS
TOTAL=${GPU_TOTAL_S:-540}
CARRY=${GPU_CARRY:-.gpu}
PY=${GPU_PYTHON:-python3}
SITE=${GPU_SITE:-/tmp/site}
MODELS=${GPU_MODELS:-/tmp/bench-models}
export BENCH_DOCS=${BENCH_DOCS:-100000} BENCH_PROMPTS=${BENCH_PROMPTS:-2048} BENCH_REPEATS=${BENCH_REPEATS:-2}
# no network there: the Hugging Face libraries must not try the Hub (and wait on it)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# the tokenizers' own threads as a user gets them (unset: on); GPU_TOKENIZERS_PARALLELISM=false turns them off
[ -n "${GPU_TOKENIZERS_PARALLELISM:-}" ] && export TOKENIZERS_PARALLELISM=$GPU_TOKENIZERS_PARALLELISM
export BENCH_PYTHON BENCH_EMBED_MODEL=$MODELS/minilm BENCH_GENERATE_MODEL=$MODELS/smollm2 BENCH_RANDOM_WEIGHTS=1
BENCH_PYTHON=$(command -v "$PY")
if [ -z "${GPU_SKIP_INSTALL:-}" ]; then
    # pip --target writes the `dagster` script with this python3 in its shebang; `python3 -m dagster` would not do:
    # it puts the working directory (this repository, whose batch_assets/ lacks resources/) first on sys.path
    # and it runs outside the checkout (BENCH_CLI_CWD, bench/ours.py): the CLI puts its working directory first on
    # sys.path too. For the same reason `python3 -P -c` below.
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} BENCH_DAGSTER=$SITE/bin/dagster BENCH_CLI_CWD=/tmp
fi

collect() {
    rc=$?
    echo "=== [$(date -u +%T)] exit $rc after $((SECONDS - START)) s; copying results into $OUT"
    results=${BENCH_RESULTS:-bench/results}
    [ -f "$results/gpu.json" ] && cp "$results/gpu.json" "$OUT/gpu.json"
    # the last 2 MB of each log: what comes back is at most 8 files (run.log and gpu.json among them)
    for f in gpu-raw-embed ours-gpu_embed ours-gpu_embed_big gpu-raw-gen ours-gpu_generate ours-gpu_smoke_generate; do
        [ -f "bench/work/logs/$f.log" ] && tail -c 2000000 "bench/work/logs/$f.log" > "$OUT/$f.log"
    done
    ls -la "$OUT"
}
trap collect EXIT

# step NAME SECONDS COMMAND...: run under `timeout`, say which step failed and how (124: it ran out of time)
step() {
    local name=$1 limit=$2
    shift 2
    echo "=== [$(date -u +%T)] step $name (limit ${limit} s, $((SECONDS - START)) s used of $TOTAL)"
    timeout -k 10 "$limit" "$@"
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "=== FAILED step $name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)') after $((SECONDS - START)) s"
    fi
    return $rc
}

step facts 60 bash -c "nvidia-smi -L; $PY bench/gpu/facts.py"
if [ -z "${GPU_SKIP_INSTALL:-}" ]; then
    step wheels 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$CARRY"/wheels/*.whl || exit 10
    # our package from this tree, built with the machine's setuptools (no network: no build isolation)
    step our-package 180 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --no-build-isolation --upgrade --target "$SITE" . || exit 11
    step imports 120 "$PY" -P -c "import dagster, openai, batch_assets.definitions, batch_assets.resources.hf.embedder, \
batch_assets.resources.hf.generator as g; print('dagster', dagster.__version__, 'from', dagster.__file__, \
'; ours from', g.__file__)" || exit 12
fi
if [ -n "${GPU_REUSE_MODELS:-}" ] && [ -f "$MODELS/minilm/model.safetensors" ] && \
    [ -f "$MODELS/smollm2/model.safetensors" ]; then
    echo "=== models: reusing $MODELS (GPU_REUSE_MODELS)"
else
    step models 240 "$PY" bench/gpu/build_models.py --tokenizers "$CARRY/models" --out "$MODELS" || exit 13
fi
[ -n "${GPU_SKIP_SMOKE:-}" ] || step smoke 240 "$PY" bench/gpu/smoke.py || exit 14
left=$((TOTAL - (SECONDS - START) - 15))
if [ "$left" -lt 60 ]; then
    echo "=== FAILED: only $left s left for the bench; raise GPU_TOTAL_S (and the command's time limit)"
    exit 15
fi
echo "=== sizes: BENCH_DOCS=$BENCH_DOCS BENCH_PROMPTS=$BENCH_PROMPTS BENCH_REPEATS=$BENCH_REPEATS"
step bench "$left" "$PY" bench/gpu/gpu_bench.py || exit 16
