"""The command that starts a backfill the daemon runs by the spec's policy:

    python -m batch_assets.commands.backfill <pipeline> --from <first> --to <last>   (or --partitions a,b / --all)

It records an *asset* backfill of the pipeline's four assets in the instance at $DAGSTER_HOME (what the UI's
backfill dialog does), so the daemon (`make ui`, or a deployment's daemon) runs it by the spec's `backfill`
policy: `single_run` makes one run for the whole range. Dagster's own `dagster job backfill` makes a *job*
backfill, which is always one run per partition, whatever the policy (docs/launch-paths.md).

The pipeline comes from the catalog of the project the command runs in (batch_assets/catalog.py; `-m` names another
code location's module), and only that pipeline is built: the backfill needs its four assets and their partitions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import dagster as dg

from batch_assets.catalog import DEFAULT_MODULE, UnknownPipelineError, for_project
from batch_assets.components.pipeline import pipeline_definitions
from batch_assets.orchestration.assets.lineage import FORCE, RERUN_TAG
from batch_assets.stage_names import ASSET_NAMES


def request_backfill(instance: dg.DagsterInstance, defs: dg.Definitions, pipeline: str, first: str | None = None,
                     last: str | None = None, partitions: list[str] | None = None, all_partitions: bool = False,
                     tags: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """Record an asset backfill of the pipeline's four assets; (backfill id, partition keys)."""
    from dagster._core.execution.backfill import PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._time import get_current_timestamp

    graph = defs.resolve_asset_graph()
    keys = [dg.AssetKey([pipeline, stage]) for stage in ASSET_NAMES]
    missing = [k.to_user_string() for k in keys if not graph.has(k)]
    if missing:
        raise SystemExit(f"pipeline {pipeline!r} is not in the code location (no asset {missing[0]}); "
                         "`dg list defs` lists the pipelines")
    pdef = graph.get(keys[0]).partitions_def
    assert pdef is not None
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        every = pdef.get_partition_keys()
        if all_partitions:
            names = list(every)
        elif partitions:
            unknown = [p for p in partitions if p not in every]
            if unknown:
                raise SystemExit(f"{unknown[0]!r} is not a partition of {pipeline} (first: {every[:1]}, last: "
                                 f"{every[-1:]})")
            names = partitions
        else:
            first, last = first or every[0], last or every[-1]
            for key in (first, last):
                if key not in every:
                    raise SystemExit(f"{key!r} is not a partition of {pipeline}")
            names = list(pdef.get_partition_keys_in_range(dg.PartitionKeyRange(first, last)))

    backfill_id = make_new_backfill_id()
    instance.add_backfill(PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id, asset_graph=graph, partition_names=names, asset_selection=keys,
        backfill_timestamp=get_current_timestamp(), tags=tags or {}, dynamic_partitions_store=instance,
        all_partitions=False, title=f"{pipeline} {names[0]}...{names[-1]}" if names else pipeline,
        description="requested by python -m batch_assets.commands.backfill", run_config=None))
    return backfill_id, names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batch_assets.commands.backfill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("pipeline")
    parser.add_argument("--from", dest="first", help="first partition (default: the first)")
    parser.add_argument("--to", dest="last", help="last partition, included (default: the last)")
    parser.add_argument("--partitions", help="comma-separated partition keys instead of a range")
    parser.add_argument("--all", action="store_true", help="every partition")
    parser.add_argument("--rerun", action="store_true",
                        help="redo partitions already made from the same source and spec (tag batch/rerun=force)")
    parser.add_argument("-m", "--module", default="",
                        help="the code location's module (default: the project's [tool.dg.project] in pyproject.toml, "
                        f"else {DEFAULT_MODULE})")
    args = parser.parse_args(argv)
    if not os.environ.get("DAGSTER_HOME"):
        print("DAGSTER_HOME is not set: point it at the instance the daemon uses (`make ui` uses "
              "./.dagster_home: DAGSTER_HOME=$PWD/.dagster_home)", file=sys.stderr)
        return 2
    try:  # only once the arguments are known good
        spec = for_project(Path.cwd(), args.module).get(args.pipeline)
    except UnknownPipelineError as exc:
        print(exc, file=sys.stderr)
        return 2

    with dg.DagsterInstance.get() as instance:
        backfill_id, names = request_backfill(
            instance, pipeline_definitions(spec), args.pipeline, args.first, args.last,
            [p.strip() for p in args.partitions.split(",") if p.strip()] if args.partitions else None,
            args.all, {RERUN_TAG: FORCE} if args.rerun else None)
    print(f"Requested backfill {backfill_id}: {args.pipeline}, {len(names)} partition(s) "
          f"{names[0] if names else ''}...{names[-1] if names else ''}; the daemon runs it by the spec's backfill "
          f"policy. Watch it in the UI: Overview > Backfills.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
