"""Retry a partition's dead letters: `python -m batch_assets.retry_dead_letters PIPELINE PARTITION`.

Only the rows that failed (and whose input is not empty) go to the model again; good rows are kept as they are, and
the output and its dead letters are republished atomically (see batch_assets.reliability.dead_letters). The model resource is
built from the pipeline's spec exactly as Dagster builds it, `{env: NAME}` secrets included. With DAGSTER_HOME set,
the new output is recorded as a materialization of `<pipeline>/output` for the partition.
"""

from __future__ import annotations

import argparse
import os
import sys

import dagster as dg

from batch_assets.orchestration.factory import build_model_resource
from batch_assets.reliability.dead_letters import retry_partition
from batch_assets.storage import ArrowStorage


def main(argv: list[str] | None = None) -> int:
    from batch_assets.definitions import load_all_specs  # importing it builds every pipeline of the code location

    parser = argparse.ArgumentParser(prog="python -m batch_assets.retry_dead_letters", description=__doc__.split("\n")[0])
    parser.add_argument("pipeline")
    parser.add_argument("partition")
    parser.add_argument("--storage-root", default="", help="default: $BATCH_STORAGE_ROOT, else ./data/storage")
    args = parser.parse_args(argv)

    specs, _ = load_all_specs()
    spec = next((s for s in specs if s.name == args.pipeline), None)
    if spec is None:
        print(f"unknown pipeline {args.pipeline!r}; known: {', '.join(sorted(s.name for s in specs))}", file=sys.stderr)
        return 2
    storage = ArrowStorage(root=args.storage_root)
    with dg.build_resources({"model": build_model_resource(spec)}) as resources:
        outcome = retry_partition(spec, storage, args.partition, resources.model)
    print(f"{spec.name} partition {args.partition!r}: retried {outcome['retried']} rows, "
          f"{outcome['still_failed']} still failed; {outcome['dead_letters']} dead letters, {outcome['rows']} rows "
          "published")
    if os.environ.get("DAGSTER_HOME"):
        dg.DagsterInstance.get().report_runless_asset_event(dg.AssetMaterialization(
            asset_key=dg.AssetKey([spec.name, "output"]), partition=args.partition,
            description="dead letters retried (python -m batch_assets.retry_dead_letters)",
            metadata={k: dg.MetadataValue.int(v) for k, v in outcome.items()},
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
