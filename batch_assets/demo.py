"""`make demo`: materialize every partition of the example pipelines through the real Dagster CLI.

Runs on the embedded default: the SQLite instance under $DAGSTER_HOME (configured by dagster.yaml), local storage
under data/, CPU models shipped in pip packages. Prints what was produced and how to open the UI.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from batch_assets.storage import PROJECT_ROOT

DEMO_PIPELINES = ["document_embeddings", "customer_industry"]


def _dagster_home() -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _materialize(name: str, keys: list[str], log_dir: Path) -> float:
    cli = Path(sys.executable).with_name("dagster")
    cmd = [str(cli), "asset", "materialize", "-m", "batch_assets.definitions", "--select", f"group:{name}",
           "--partition-range", f"{keys[0]}...{keys[-1]}"]
    log = log_dir / f"{name}.log"
    print(f"\n==> {name}: {len(keys)} partitions ({keys[0]} ... {keys[-1]}) in one run\n    $ {' '.join(cmd[1:])}")
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-25:]
        print("\n".join(tail))
        raise SystemExit(f"{name} failed (exit {proc.returncode}); full log: {log}")
    print(f"    done in {elapsed:.0f}s (log: {log.relative_to(PROJECT_ROOT) if log.is_relative_to(PROJECT_ROOT) else log})")
    return elapsed


def _summary(name: str, elapsed: float) -> None:
    instance = dg.DagsterInstance.get()
    for stage in ("inferred", "output"):
        event = instance.get_latest_materialization_event(dg.AssetKey([name, stage]))
        md = event.asset_materialization.metadata if event and event.asset_materialization else {}
        values = {k: getattr(v, "value", v) for k, v in md.items()}
        if stage == "inferred":
            extra = f", model {values.get('model')}, {values.get('rows_per_s')} rows/s in the infer step"
            if "tokens_out" in values:
                extra += f", tokens in/out {values['tokens_in']}/{values['tokens_out']}"
            print(f"    infer: {values.get('rows_out')} rows, {values.get('rows_with_errors')} row errors{extra}")
        else:
            paths = str(values.get("path", ""))
            folder = str(Path(paths.split(",")[0].strip()).parent)
            print(f"    output: {values.get('rows_out')} rows in {folder}")
            if name == "customer_industry":
                counts: collections.Counter[str] = collections.Counter()
                for f in sorted(Path(folder).glob("*.parquet")):
                    counts.update(pq.read_table(f, columns=["inferred_industry"]).column(0).to_pylist())
                print("    inferred_industry: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))


def main() -> None:
    home = _dagster_home()
    log_dir = home / "demo-logs"
    log_dir.mkdir(exist_ok=True)
    from batch_assets.definitions import defs

    total = time.perf_counter()
    timings = {}
    for name in DEMO_PIPELINES:
        asset = defs.resolve_assets_def(dg.AssetKey([name, "raw"]))
        keys = asset.partitions_def.get_partition_keys()
        timings[name] = _materialize(name, keys, log_dir)
    print("\n==> Summary")
    for name in DEMO_PIPELINES:
        print(f"  {name} ({timings[name]:.0f}s):")
        _summary(name, timings[name])
    print(f"\nAll done in {time.perf_counter() - total:.0f}s. Dagster instance: {home}")
    print("Open the UI to see the assets, runs and metadata:  make ui   (then http://127.0.0.1:3000)")


if __name__ == "__main__":
    main()
