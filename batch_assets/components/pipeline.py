"""A batch-inference pipeline declared as a Dagster Component: a `defs.yaml` under batch_assets/defs/ whose
`attributes` are exactly a pipeline spec (the same fields as a file in batch_assets/pipelines/).

The component adds no second spec format: its attribute model IS `PipelineSpec`, so `dg check defs` validates a
`defs.yaml` with the same cross-field checks as the YAML spec folder (errors point at the line in the file), and
both routes build their assets through `factory.build_pipeline_definitions`.

Adding one defs.yaml to a Dagster project is all a user does: `build_defs` brings every resource the pipeline's
assets require (the storage, shared by every pipeline as one object so any number of Components, the user's own
Definitions and batch_assets.definitions merge; the model, one per pipeline). It brings no executor: a project's
executor is its own (merging two conflicts); batch_assets.definitions.executor_definitions() is the one call that
adds the product's (docs/adding-a-pipeline.md).

Attributes accept Dagster's templating, as a Resolvable component's do: `{{ env.REVIEWS_DIR }}`, `{{ project_root }}`
and `{{ context.project_root }}`, rendered before the spec is validated. Relative local paths resolve against the
project the defs.yaml belongs to (batch_assets/storage.py `project_root`).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from dagster.components.resolved.errors import ResolutionException
from dagster.components.resolved.scopes import EnvScope, LoadContextScope
from pydantic import BaseModel

from batch_assets.orchestration.assets.factory import STORAGE_KEY, build_pipeline_definitions
from batch_assets.orchestration.launch.paths import launch_definitions
from batch_assets.spec import NAME_RE, PipelineSpec, SpecError, anchor_local_paths, parse_spec
from batch_assets.storage import DEFAULT_STORAGE

TEMPLATE_MARKS = ("{{", "{%")  # jinja2's expression and statement openers; a prompt's {column} is neither


class PipelineScaffolder(Scaffolder):
    """`dg scaffold defs batch_assets.components.BatchInferencePipeline <name>` writes a working embedding
    pipeline over the built-in sample documents, named after the folder, to edit from there."""

    def scaffold(self, request: ScaffoldRequest) -> None:
        name = request.target_path.name.replace("-", "_").lower()
        if not NAME_RE.match(name):
            raise ValueError(f"folder name {request.target_path.name!r} must make a pipeline name matching "
                             f"{NAME_RE.pattern}")
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(textwrap.dedent(f"""\
            # A batch-inference pipeline; attributes are a pipeline spec (every field: docs/spec-reference.md).
            type: {request.type_name}
            attributes:
              name: {name}
              description: Embed the sample documents with all-MiniLM-L6-v2.
              source:
                format: jsonl
                path: data/samples/documents/*.jsonl
                columns: [doc_id, topic, title, text]
                sample: documents
              partitioning: {{kind: hash, count: 2}}
              prepare: {{id_column: doc_id, text_column: text}}
              task: {{kind: embed}}
              model: {{provider: sentence_transformers, config: {{batch_size: 32, normalize: true}}}}
              sink: {{format: parquet, columns: [doc_id, title, embedding, error]}}
            """))


@dg.scaffold_with(PipelineScaffolder)
class BatchInferencePipeline(dg.Component):
    """Four partitioned assets (read -> prepare -> infer -> write) from one pipeline spec given as attributes."""

    def __init__(self, spec: PipelineSpec):
        self.spec = spec

    @classmethod
    def get_model_cls(cls) -> type[BaseModel]:
        return PipelineSpec

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> "BatchInferencePipeline":
        if not isinstance(attributes, PipelineSpec):
            raise ValueError(f"{context.path}: a BatchInferencePipeline needs attributes (a pipeline spec)")
        origin = context.path / "defs.yaml" if context.path.is_dir() else context.path
        raw = _yaml_attributes(context)
        if raw is not None and _templated(raw):
            attributes = parse_spec(_render(raw, context, origin), origin=str(origin))
        return cls(anchor_local_paths(attributes, origin))

    def build_defs(self, context: dg.ComponentLoadContext | None) -> dg.Definitions:
        return pipeline_definitions(self.spec)


def pipeline_definitions(spec: PipelineSpec) -> dg.Definitions:
    """One pipeline, complete: its assets, checks and job, its schedule or sensors, and every resource they need.
    What a Component brings to a project, and what a command builds for the one pipeline it runs."""
    return dg.Definitions.merge(build_pipeline_definitions(spec), launch_definitions(spec),
                                dg.Definitions(resources={STORAGE_KEY: DEFAULT_STORAGE}))


def _yaml_attributes(context: dg.ComponentLoadContext) -> dict[str, Any] | None:
    """The attributes as written in defs.yaml (None for a Component built in Python): templates are rendered on
    these, not on the validated spec, whose defaults and types would otherwise be rendered too."""
    file_model = getattr(getattr(context, "component_decl", None), "component_file_model", None)
    raw = getattr(file_model, "attributes", None)
    return raw if isinstance(raw, dict) else None


def _templated(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_templated(v) for v in value.values())
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    return isinstance(value, str) and any(mark in value for mark in TEMPLATE_MARKS)


class _SetEnv(EnvScope):
    """`{{ env.NAME }}` as Dagster has it, except that an unset NAME fails the load, naming it: Dagster renders it
    as None, and `{{ env.REVIEWS_DIR }}/x.jsonl` would silently become the relative path `None/x.jsonl`.
    `{{ env('NAME', 'default') }}` still gives a default."""

    def __getattr__(self, key: str) -> str | None:
        if key.startswith("jinja") or key in os.environ:
            return super().__getattr__(key)
        raise ResolutionException(f"environment variable {key} is not set: export it where the code location "
                                  f"loads, or give a default with env('{key}', 'default')")


def _render(raw: dict[str, Any], context: dg.ComponentLoadContext, origin: Path) -> dict[str, Any]:
    """Dagster's own rendering (jinja2, with the scope a Resolvable component gets: env, context, project_root), on
    the strings that hold a template only: a plain string such as a static partition key "2026" must stay a string,
    where Dagster's native rendering would turn it into a number. An undefined name or unset variable fails the load
    with the defs.yaml and the attribute's path."""
    resolution = context.with_rendering_scope({
        "context": LoadContextScope(context),
        "project_root": str(context.project_root.resolve()),
        "env": _SetEnv(),
    }).resolution_context.at_path("attributes")

    def render(value: Any, at, where: str) -> Any:
        if isinstance(value, dict):
            return {k: render(v, at.at_path(k), f"{where}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [render(v, at.at_path(i), f"{where}[{i}]") for i, v in enumerate(value)]
        if not _templated(value):
            return value
        try:
            return at.resolve_value(value)
        except ResolutionException as exc:  # Dagster's message names the file; this says which attribute
            raise SpecError(f"{origin}: {where} = {value!r} could not be rendered: {exc}") from None

    return render(raw, resolution, "attributes")
