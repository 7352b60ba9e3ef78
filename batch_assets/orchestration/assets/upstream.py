"""An asset of the user's project as a pipeline's source (`source.asset`, docs/reading-data.md).

The pipeline's raw asset depends on the upstream asset through an `AssetDep` with the spec's partition mapping, so
the asset graph (UI, `dg list defs`) shows the edge and declarative automation sees the upstream's
materializations (automation.py, `on_upstream_update`). The files are still read from `source.path`: the
upstream asset writes them, and the content version of each file (lineage.py) decides whether a run has anything
to do.

What the spec alone cannot know, the whole code location can: `upstream_problems` checks that the key is an asset
of the code location and that its partitions map onto the pipeline's. `check_upstream_sources`
(orchestration/upstream_checks.py) runs it on a code location's Definitions (batch_assets/definitions.py on the product's own),
before Dagster would stop at the first mapping it cannot use with a message that names neither the pipeline nor
the fix.
"""

from __future__ import annotations

import difflib

import dagster as dg

from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import READ


def upstream_key(spec: PipelineSpec) -> dg.AssetKey | None:
    return dg.AssetKey(spec.source.asset.split("/")) if spec.source.asset else None


def partition_mapping(spec: PipelineSpec) -> dg.PartitionMapping:
    assert spec.source.partition_mapping == "identity"  # the only mapping the spec accepts
    return dg.IdentityPartitionMapping()


def _describe(pdef: dg.PartitionsDefinition | None) -> str:
    if pdef is None:
        return "unpartitioned"
    if isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        return (f"time windows ({pdef.cron_schedule}, timezone {pdef.timezone}, from "
                f"{pdef.start.strftime(pdef.fmt)}{', format ' + pdef.fmt if pdef.fmt != '%Y-%m-%d' else ''})")
    if isinstance(pdef, dg.DynamicPartitionsDefinition):
        return f"dynamic partitions named {pdef.name!r}"
    if isinstance(pdef, dg.StaticPartitionsDefinition):
        keys = pdef.get_partition_keys()
        return f"static keys {', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''}"
    return type(pdef).__name__


def mapping_problem(spec: PipelineSpec, upstream: dg.PartitionsDefinition | None,
                    mine: dg.PartitionsDefinition) -> str | None:
    """Why partition K of the pipeline cannot read partition K of the upstream asset (identity), or None."""
    name = spec.source.asset
    fix = (f"partition the pipeline as {name!r} is (partitioning in the spec), or partition {name!r} as the "
           "pipeline is")
    if upstream == mine:  # the same definition (any kind, multi-dimensional ones too): K maps to K
        return None
    if upstream is None:
        return (f"{name!r} is unpartitioned, the pipeline is partitioned by {_describe(mine)}: there is no "
                f"upstream partition to read for each of the pipeline's; partition {name!r} (one file per "
                "partition at source.path)")
    if isinstance(mine, dg.TimeWindowPartitionsDefinition):
        same = isinstance(upstream, dg.TimeWindowPartitionsDefinition) and (
            upstream.cron_schedule, upstream.timezone, upstream.fmt) == (mine.cron_schedule, mine.timezone,
                                                                         mine.fmt)
    elif isinstance(mine, dg.DynamicPartitionsDefinition):
        same = isinstance(upstream, dg.DynamicPartitionsDefinition) and upstream.name == mine.name
        fix = (f"give {name!r} the partitions dg.DynamicPartitionsDefinition(name={mine.name!r}) (the pipeline's "
               "own: one set of keys for both)")
    else:
        keys = set(upstream.get_partition_keys()) if isinstance(upstream, dg.StaticPartitionsDefinition) else None
        missing = sorted(set(mine.get_partition_keys()) - keys) if keys is not None else None
        same = missing == []
        if missing:
            fix = f"partitions {', '.join(missing[:6])} of the pipeline are not partitions of {name!r}: " + fix
    if same:
        return None
    return (f"identity partition mapping: {name!r} is partitioned by {_describe(upstream)}, the pipeline by "
            f"{_describe(mine)}; {fix}")


def upstream_dep(spec: PipelineSpec) -> dg.AssetDep | None:
    """The raw asset's dependency on source.asset (None without one)."""
    key = upstream_key(spec)
    return dg.AssetDep(key, partition_mapping=partition_mapping(spec)) if key is not None else None


def upstream_problems(defs: dg.Definitions, specs: list[PipelineSpec]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the pipelines of `specs` against `defs`: a source.asset whose partitions do not map
    onto the pipeline's is a problem; one that is not an asset of `defs` a warning, since it may be defined in
    another code location of the workspace (Dagster shows it as an external asset then)."""
    graph = defs.resolve_asset_graph()
    problems, warnings = [], []
    for spec in specs:
        key = upstream_key(spec)
        if key is None:
            continue
        where = f"pipeline {spec.name!r}: source.asset {spec.source.asset!r}"
        node = graph.get(key) if graph.has(key) else None
        if node is None or not _declared(node):
            known = [k.to_user_string() for k in graph.get_all_asset_keys() if k.path[0] != spec.name
                     and _declared(graph.get(k))]
            close = difflib.get_close_matches(key.to_user_string(), known, n=3)
            warnings.append(f"{where} is not an asset of this code location"
                            + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
                            + ": the pipeline runs when that asset is materialized, so unless another code location "
                            "of your workspace defines it, nothing will ever run it; name an asset your Definitions "
                            "define, its key parts joined by '/'")
            continue
        mine = graph.get(dg.AssetKey([spec.name, READ.asset])).partitions_def
        problem = mapping_problem(spec, node.partitions_def, mine)
        if problem:
            problems.append(f"{where}: {problem}")
    return problems, warnings


def _declared(node: object) -> bool:
    """An asset of the code location: one it materializes or observes, or one it declares with a `dg.AssetSpec` (an
    asset another system makes, whose materializations are reported to Dagster: its partitions are known and must
    map). Not the stub Dagster makes for a key that is only named as a dependency."""
    if node.is_materializable or node.is_observable:  # type: ignore[attr-defined]
        return True
    return not node.assets_def.is_auto_created_stub  # type: ignore[attr-defined]
