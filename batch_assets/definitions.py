"""The Dagster code location: one set of assets per pipeline of the catalog (batch_assets/catalog.py): the spec
files in batch_assets/pipelines/*.yaml and the pipelines declared as Dagster Components under batch_assets/defs/
(`BatchInferencePipeline` defs.yaml files), every one built by the same factory calls.

Set BATCH_PIPELINES_DIR to load specs from another folder (os.pathsep-separated for several) instead of both
built-in places (tests and deployments that bring their own pipelines). BATCH_EXECUTOR chooses the local
executor (batch_assets/orchestration/execution/executors.py).

Each spec is loaded and built on its own: a broken spec (invalid YAML or fields, a duplicate name, a source that
cannot be listed at load) does not take the other pipelines down with it. It is reported as a definitions-load
warning and as an asset `broken_pipelines/<file>` whose description holds the error and whose materialization fails
with it, so the UI shows what is wrong and where instead of a code location that will not load. Under `dg check
defs` (and `dagster definitions validate`, which set DAGSTER_IS_DEFS_VALIDATION_CLI=1) a broken spec fails the load
instead, listing every broken file and its error, so the command exits non-zero and a CI gate catches it.

Set BATCH_EXECUTOR=k8s to run every step as a Kubernetes Job, infer steps sized per partition
(batch_assets/orchestration/execution/k8s_executor.py, docs/deployment.md).

These definitions merge into a user's own Dagster project (`dg.Definitions.merge`): the storage resource is the one
object every pipeline Component brings too, and the built-in Components load from the package itself, with or
without a pyproject.toml (an installed wheel has none). The executor is this code location's; a user's project
that only wants the executor merges `executor_definitions()`.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import dagster as dg

from batch_assets.catalog import (COMPONENTS_DIR, BrokenSpec, PipelineCatalog, built_in, built_in_component_tree,
                                  load_error)
from batch_assets.components.pipeline import pipeline_definitions
from batch_assets.orchestration.assets.factory import STORAGE_KEY, pipeline_specs
from batch_assets.orchestration.execution.executors import local_executor
from batch_assets.orchestration.upstream_checks import check_upstream_sources
from batch_assets.resources.provider_errors import MissingExtraError
from batch_assets.spec import PipelineSpec, SpecError
from batch_assets.storage import DEFAULT_STORAGE, DEFAULT_STORAGE_ROOT, check_root_for_executor

# `dg launch --assets "group:<name>"` parses the selection with AssetSelection.groups(include_sources=...), a
# parameter dagster 1.13 marks beta, so every launch printed a BetaWarning about Dagster's own call; silenced here,
# for that parameter only, since the launch imports this module first.
warnings.filterwarnings("ignore", category=dg.BetaWarning, message=r"Parameter `include_sources` of function "
                        r"`AssetSelection\.groups`")
BROKEN_GROUP = "broken_pipelines"
VALIDATION_ENV = "DAGSTER_IS_DEFS_VALIDATION_CLI"  # set by `dg check defs` and `dagster definitions validate`
log = logging.getLogger(__name__)


class BrokenPipelineWarning(UserWarning):
    """A pipeline spec could not be loaded; the other pipelines of the code location still are."""


def _asset_name(origin: str) -> str:
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in Path(origin).stem.lower())
    return stem if stem[:1].isalpha() else f"spec_{stem}"


def broken_spec_asset(broken: BrokenSpec, name: str) -> dg.AssetsDefinition:
    """An asset standing for a spec that did not load: visible in the UI, failing with the spec's error."""

    @dg.asset(
        key=dg.AssetKey([BROKEN_GROUP, name]),
        group_name=BROKEN_GROUP,
        description=f"This pipeline spec could not be loaded: {broken.error}",
        metadata={"spec_file": broken.origin, "error": broken.error},
    )
    def _broken() -> None:
        raise SpecError(f"{broken.error}\n(the spec {broken.origin} did not load; fix it and reload the code "
                        "location)")

    return _broken


def build_definitions(specs: list[PipelineSpec], broken: list[BrokenSpec] | None = None,
                      components: bool | dg.ComponentTree | None = False) -> dg.Definitions:
    """The code location of `specs`, and of the pipeline Components of `components` (True: batch_assets/defs/),
    which Dagster builds from their tree, as it does in a user's project (`dg list defs` then names each asset's
    defs.yaml); both routes build a pipeline with the same call, `pipeline_definitions`."""
    broken = list(broken or [])
    per_pipeline = []
    for spec in specs:
        try:
            per_pipeline.append(pipeline_definitions(spec))
        except Exception as exc:  # surfaced below as a failing asset + warning: never swallowed
            broken.append(BrokenSpec(spec.name, f"pipeline {spec.name!r} could not be built: {exc}"))
    if components:
        try:
            per_pipeline.append(component_definitions(built_in_component_tree() if components is True else components))
        except Exception as exc:  # same treatment as a broken spec file: a failing asset and a warning
            broken.append(BrokenSpec(str(COMPONENTS_DIR), f"the component pipelines did not load: {load_error(exc)}"))
    if broken and os.environ.get(VALIDATION_ENV) == "1":
        # `dg check defs` / `dagster definitions validate`: a CI gate must fail on a broken pipeline, while the UI
        # and the daemon keep serving the healthy ones (below).
        raise SpecError(f"{len(broken)} pipeline spec(s) did not load:\n" + "\n".join(
            f"- {b.origin}: {b.error}" for b in broken))
    for b in broken:
        message = f"pipeline spec {b.origin} was not loaded: {b.error}"
        log.warning(message)
        warnings.warn(message, BrokenPipelineWarning, stacklevel=2)
    names: list[str] = []
    for b in broken:
        name = _asset_name(b.origin)
        names.append(name if name not in names else f"{name}_{len(names)}")
    pipelines = dg.Definitions.merge(*per_pipeline) if per_pipeline else dg.Definitions()
    shared = dg.Definitions(resources={STORAGE_KEY: DEFAULT_STORAGE},
                            assets=[broken_spec_asset(b, n) for b, n in zip(broken, names)])
    return check_upstream_sources(dg.Definitions.merge(shared, pipelines, executor_definitions(pipelines)))


def executor_definitions(pipelines: dg.Definitions | None = None) -> dg.Definitions:
    """The product's executor as Definitions to merge: what $BATCH_EXECUTOR chooses (in_process by default: a run
    loads its model once; batch_assets/orchestration/execution/executors.py), or with BATCH_EXECUTOR=k8s one Kubernetes Job per
    step, infer steps sized for the pipelines in `pipelines`. The pipeline Components bring no executor (a project
    has one executor, and its own wins); a project that wants this one merges it in its definitions.py
    (docs/adding-a-pipeline.md)."""
    if os.environ.get("BATCH_EXECUTOR") == "k8s":
        try:
            from batch_assets.orchestration.execution.k8s_executor import batch_k8s_executor  # heavy: dagster-k8s
        except ImportError as exc:
            raise MissingExtraError("dagster-k8s", "k8s", "BATCH_EXECUTOR=k8s (one Kubernetes Job per step)") from exc

        executor = batch_k8s_executor(pipeline_specs(pipelines or dg.Definitions()))  # components' too
        # refused when the code location loads, before any run: the same check every step makes at run time
        check_root_for_executor(os.environ.get("BATCH_STORAGE_ROOT") or DEFAULT_STORAGE_ROOT)
    else:
        executor = local_executor()  # in_process by default; see batch_assets/orchestration/execution/executors.py
    return dg.Definitions(executor=executor)


def component_definitions(tree: dg.ComponentTree) -> dg.Definitions:
    """The Components' definitions, built by Dagster from their tree. The component tree is left out of the result:
    a user's project that merges these definitions into its own brings its own tree, and Dagster merges one."""
    with warnings.catch_warnings():  # Dagster's own preview/beta calls inside the loader, as load_from_defs_folder hides
        warnings.simplefilter("ignore", dg.BetaWarning)
        warnings.simplefilter("ignore", dg.PreviewWarning)
        loaded = tree.build_defs()
    return dg.Definitions(assets=loaded.assets, asset_checks=loaded.asset_checks, jobs=loaded.jobs,
                          schedules=loaded.schedules, sensors=loaded.sensors, resources=loaded.resources,
                          executor=loaded.executor, loggers=loaded.loggers, metadata=loaded.metadata)


def code_location(catalog: PipelineCatalog) -> dg.Definitions:
    """Every pipeline of the catalog: its spec files built here, its Components built by Dagster from their tree."""
    return build_definitions(catalog.files, catalog.broken, components=catalog.tree)


defs = code_location(built_in())
