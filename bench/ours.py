"""Our pipeline as a user runs it: a spec in BATCH_PIPELINES_DIR and the real Dagster CLI
(`dagster asset materialize --partition-range`), one whole process per run. After a run, the instance's event
log gives the infer step's own time (the `inferred` asset's per-partition `duration_s`: read prepared rows,
infer, write; model load excluded; the step's span where its partitions overlapped) and the log gives how many times a model was loaded."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from common import OUR_PY, ROOT, WORK, Run, cli, run_process

DAGSTER = cli("dagster")
DG = cli("dg")
HOME = WORK / "dagster_home"
KEYS = [f"part-{i}" for i in range(4)]
# BENCH_EMBED_MODEL / BENCH_GENERATE_MODEL: a model folder instead of the shipped MiniLM / SmolLM2 GGUF, for the raw
# scripts and our specs alike (a lent GPU machine has neither package: bench/gpu/build_models.py makes random-weight
# folders of the same shapes there)
EMBED_MODEL = os.environ.get("BENCH_EMBED_MODEL")
GENERATE_MODEL = os.environ.get("BENCH_GENERATE_MODEL")
# BENCH_CLI_CWD: where the CLI runs. The dagster CLI puts its working directory first on sys.path, so from this
# checkout `-m batch_assets.definitions` imports the checkout's batch_assets/, which has no resources/ (setup.py maps
# them in when installed; a .venv's editable install finds them, an install with `pip --target` does not). A user
# runs it from their own project: on a lent GPU machine run_on_device.sh sets a folder outside the checkout.
CLI_CWD = Path(os.environ.get("BENCH_CLI_CWD", str(ROOT)))


def embed_spec(name: str, data: Path, keys: list[str], chunk_rows: int | None = None,
               device: str = "cpu", precision: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "source": {"format": "parquet", "path": str(data / "{partition}.parquet"), "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": keys},
        "prepare": {"id_column": "doc_id", "text_column": "text"},
        "task": {"kind": "embed"},
        "model": {"provider": "sentence_transformers", "config": {"device": device, "batch_size": 32}},
        "sink": {"path": str(WORK / "out" / name), "format": "parquet"},
    }
    if chunk_rows:
        spec["runtime"] = {"chunk_rows": chunk_rows}
    if precision:
        spec["model"]["config"]["precision"] = precision
    if EMBED_MODEL:
        spec["model"]["config"]["model"] = EMBED_MODEL
    return spec


def generate_spec(name: str, data: Path, keys: list[str], max_new_tokens: int = 16,
                  device: str = "cpu") -> dict[str, Any]:
    config: dict[str, Any] = {"device": device, "batch_size": 32}
    if GENERATE_MODEL:
        config["model"] = GENERATE_MODEL
    return _prompts_spec(name, data, keys, max_new_tokens, {"provider": "transformers", "config": config})


def api_spec(name: str, data: Path, keys: list[str], in_flight: int) -> dict[str, Any]:
    return _prompts_spec(name, data, keys, 16, {"provider": "openai", "config": {
        "model": "bench", "base_url": {"env": "BENCH_OPENAI_BASE_URL"}, "api_key": {"env": "BENCH_OPENAI_KEY"},
        "max_concurrency": in_flight}})


def transcribe_spec(name: str, folders: Path, device: str = "cpu", chunk_rows: int = 64,
                    **config: Any) -> dict[str, Any]:
    """The audio files of a folder per partition (`folders/<key>/*`, bench/run.py bench_transcribe), read by the
    `format: files` source as a user's bucket of recordings would be, through the faster_whisper provider with the
    raw script's model and settings (tiny.en, int8 on CPU, beam 5, VAD)."""
    return {
        "name": name,
        "source": {"format": "files", "path": str(folders / "{partition}" / "*")},
        "partitioning": {"kind": "static", "keys": KEYS},
        "prepare": {"input_columns": ["file_path"]},
        "task": {"kind": "transcribe"},
        "model": {"provider": "faster_whisper", "config": {"device": device, **config}},
        "runtime": {"chunk_rows": chunk_rows},
        "sink": {"path": str(WORK / "out" / name), "format": "parquet"},
    }


def _prompts_spec(name: str, data: Path, keys: list[str], max_new_tokens: int, model: dict[str, Any]) -> dict[str, Any]:
    """Greedy answers to the prompts of bench/data.py (write_prompts), from `model`."""
    return {
        "name": name,
        "source": {"format": "parquet", "path": str(data / "{partition}.parquet"),
                   "columns": ["prompt_id", "question"]},
        "partitioning": {"kind": "static", "keys": keys},
        "prepare": {"id_column": "prompt_id", "template": "{question}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": max_new_tokens, "temperature": 0}},
        "model": model,
        "sink": {"path": str(WORK / "out" / name), "format": "parquet"},
    }


def noop_definitions() -> Path:
    """A code location with one asset that does nothing: the floor of `dagster asset materialize`."""
    folder = WORK / "noop"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench_noop_defs.py").write_text(
        "import dagster as dg\n\n\n@dg.asset\ndef noop() -> None:\n    return None\n\n\n"
        "defs = dg.Definitions(assets=[noop])\n")
    return folder


def prepare_home() -> None:
    HOME.mkdir(parents=True, exist_ok=True)
    (HOME / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")


def before_tree() -> Path | None:
    """BENCH_BEFORE_TREE: a checkout of an older commit (`git worktree add /tmp/before <commit>`), run with this
    virtualenv, so one bench run compares our code before and after a change."""
    tree = os.environ.get("BENCH_BEFORE_TREE")
    return Path(tree) if tree else None


def before_label() -> str:
    tree = before_tree()
    if tree is None:
        return ""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    return commit.stdout.strip() or tree.name


def materialize(spec: dict[str, Any], keys: list[str], env: dict[str, str] | None = None, label: str = "",
                tree: Path | None = None, launcher: str = "materialize") -> Run:
    """One whole-process `dagster asset materialize` of every stage of `spec` over `keys` (one run); with `tree`,
    the code of that checkout instead of this one; with `launcher="dg"`, through `dg launch` (what the docs tell
    users to run) instead."""
    name = spec["name"]
    pipelines = WORK / "pipelines" / name
    storage = WORK / "storage" / name
    for folder in (pipelines, storage, WORK / "out" / name):
        shutil.rmtree(folder, ignore_errors=True)
    pipelines.mkdir(parents=True)
    (pipelines / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    prepare_home()
    if launcher == "dg":
        cmd = [*DG, "launch", "--assets", f"group:{name}"]
    else:
        cmd = [*DAGSTER, "asset", "materialize", "-m", "batch_assets.definitions", "--select", f"group:{name}"]
    cmd += ["--partition", keys[0]] if len(keys) == 1 else ["--partition-range", f"{keys[0]}...{keys[-1]}"]
    extra = {"PYTHONPATH": str(tree)} if tree else {}
    run = run_process(cmd, env={"BATCH_PIPELINES_DIR": str(pipelines), "BATCH_STORAGE_ROOT": str(storage),
                                "DAGSTER_HOME": str(HOME), **extra, **(env or {})},
                      cwd=tree or CLI_CWD, log=WORK / "logs" / f"ours-{name}{label}{'-before' if tree else ''}.log")
    if run.rc == 0:
        run.result.update(run_metrics(name, run.start_epoch, run.end_epoch))
        run.result["model_loads"] = len(re.findall(r"Loaded model ", run.log_path.read_text(errors="replace")))
    return run


def materialize_noop() -> Run:
    folder = noop_definitions()
    prepare_home()
    return run_process([*DAGSTER, "asset", "materialize", "-f", str(folder / "bench_noop_defs.py"),
                        "--select", "noop"], env={"DAGSTER_HOME": str(HOME)}, cwd=folder,
                       log=WORK / "logs" / "noop.log")


def run_metrics(name: str, start_epoch: float = 0.0, end_epoch: float = 0.0) -> dict[str, Any]:
    """The latest run's per-partition `duration_s` of each stage, and where the whole process's time went (from
    the event log's timestamps: CLI start and definitions load before the run's first event, resource (model)
    initialisation, each step, and exit after the run's last event)."""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(HOME)) as instance:
        run = instance.get_runs(limit=1)[0]
        out: dict[str, Any] = {"run_id": run.run_id}
        precisions: dict[str, str] = {}
        for stage in ("raw", "prepared", "inferred", "output"):
            records = instance.fetch_materializations(dg.AssetKey([name, stage]), limit=1000).records
            per_partition = {}
            for rec in records:
                if rec.run_id != run.run_id:
                    continue
                mat = rec.asset_materialization
                md = mat.metadata if mat else {}
                if "duration_s" in md:
                    per_partition[mat.partition] = float(md["duration_s"].value)
                if "precision" in md:  # precision: fast is decided per partition (resources/hf/precision.py)
                    precisions[mat.partition] = str(md["precision"].value)
            out[f"{stage}_s"] = sum(per_partition.values())
        if precisions:
            out["partitions_fast"] = sum(p.startswith("fast") for p in precisions.values())
        logs = instance.all_logs(run.run_id)
        if logs and start_epoch:
            out["phase_cli_start_and_definitions_s"] = logs[0].timestamp - start_epoch
            out["phase_exit_s"] = end_epoch - logs[-1].timestamp
        stamps: dict[str, float] = {}
        for e in logs:
            if e.is_dagster_event:
                kind = e.dagster_event.event_type_value
                stamps.setdefault(f"{kind}:{e.step_key or ''}", e.timestamp)
                if kind == "RESOURCE_INIT_SUCCESS":
                    stamps["RESOURCE_INIT_SUCCESS_LAST"] = e.timestamp
        inits = [t for k, t in stamps.items() if k.startswith("RESOURCE_INIT_STARTED")]
        if inits and "RESOURCE_INIT_SUCCESS_LAST" in stamps:
            out["phase_resource_init_s"] = stamps["RESOURCE_INIT_SUCCESS_LAST"] - min(inits)
        for stage in ("raw", "prepared", "inferred", "output"):
            key = f"{name}__{stage}"
            if f"STEP_START:{key}" in stamps and f"STEP_SUCCESS:{key}" in stamps:
                out[f"phase_step_{stage}_s"] = stamps[f"STEP_SUCCESS:{key}"] - stamps[f"STEP_START:{key}"]
            if f"phase_step_{stage}_s" in out and out[f"phase_step_{stage}_s"] < out[f"{stage}_s"]:
                # partitions overlapped (an HTTP provider's infer step, batch_assets/orchestration/execution/overlap.py):
                # their durations overlap in time, so the step's own span is the time it took
                out[f"{stage}_s"] = out[f"phase_step_{stage}_s"]
        window = [e.timestamp for e in logs
                  if e.is_dagster_event and (e.step_key or "").endswith("__inferred")
                  and e.dagster_event.event_type_value in ("STEP_START", "STEP_SUCCESS")]
        if len(window) == 2:
            out["infer_window"] = window  # epoch seconds: GPU utilisation is averaged over this window
        return out


def python() -> str:
    return str(OUR_PY)
