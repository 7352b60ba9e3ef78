"""A batch-inference pipeline declared as a Dagster Component: a `defs.yaml` under batch_assets/defs/ whose
`attributes` are exactly a pipeline spec (the same fields as a file in batch_assets/pipelines/).

The component adds no second spec format: its attribute model IS `PipelineSpec`, so `dg check defs` validates a
`defs.yaml` with the same cross-field checks as the YAML spec folder (errors point at the line in the file), and
both routes build their assets through `factory.build_pipeline_definitions`.
"""

from __future__ import annotations

import textwrap

import dagster as dg
from dagster.components import Scaffolder, ScaffoldRequest
from pydantic import BaseModel

from batch_assets.orchestration.factory import build_pipeline_definitions
from batch_assets.orchestration.launch import launch_definitions
from batch_assets.spec import NAME_RE, PipelineSpec


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
        return cls(attributes)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return dg.Definitions.merge(build_pipeline_definitions(self.spec), launch_definitions(self.spec))
