"""A pipeline declared once: source, partitioning, preparation, task, model and sink.

A spec is a YAML file in batch_assets/pipelines/, or the attributes of a Dagster Component (`BatchInferencePipeline`,
batch_assets/components/pipeline.py, whose attribute model is this PipelineSpec); either way it is validated by
pydantic (typed, with field paths in every error) and turned into Dagster assets by orchestration/assets/factory.py. The
spec itself stays a plain pydantic model, readable outside a Dagster process (the demo driver, benchmarks, tests),
and its validators cross-check fields (template columns against source columns, task against provider capability,
sink and source formats against their registries) at definition load.

Over 400 lines, on purpose: the sections are small models, and the cross-field checks below need all of them at
once; spread over several modules, each check would send the reader to every one of them.
"""

from __future__ import annotations

import re
import string
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, ValidationError, model_validator

from batch_assets.spec_prepare import (
    ColumnTransform,
    DocumentSpec,
    JoinSpec,
    TrialSpec,
    function_problem,
    join_output_problems,
)
from batch_assets.stages.sinks import SINKS, sink_for
from batch_assets.stages.sources import SOURCES
from batch_assets.stages.sources.files import FILE_COLUMNS
from batch_assets.storage import is_remote, resolve_local
from batch_assets.tasks import RESERVED_COLUMNS, TASKS
from batch_assets.resources.protocols import supports
from batch_assets.resources.registry import PROVIDERS, provider_class
from batch_assets.resources.secrets import literal_secret_problem, literal_secrets
from batch_assets.resources.structured import StructuredOutput

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
PARTITION_TOKEN = "{partition}"


class SpecError(ValueError):
    """A pipeline spec is invalid; raised at definition load, naming the pipeline, the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceSpec(_Strict):
    format: Literal[tuple(SOURCES)] = Field(
        description="File format of every source file; `files`: the files themselves, one row per file matched by "
        f"`path` (columns {', '.join(FILE_COLUMNS)}; no bytes in the rows: images, documents and audio are read from "
        "file_path by the stage that needs them). See docs/files-as-data.md.")
    path: str = Field(
        description="Local path or s3://bucket/key. A relative path resolves against the pipeline's project folder: "
        "$BATCH_PROJECT_ROOT, else the pyproject.toml/dg.toml project at or above the spec file or defs.yaml, else "
        "the current directory (docs/concepts.md, Relative paths). May hold a glob (*, **, ?) and the token "
        "{partition}, replaced by the partition key (multi partitioning: also {<dimension name>}, replaced by that "
        "dimension's key)."
    )
    columns: list[str] = Field(min_length=1, description="Columns to read; a file lacking one is an error. "
                               f"format files: optional, some of {', '.join(FILE_COLUMNS)} (default: all four).")
    encoding: str = Field(default="utf-8", description="Text encoding of csv/jsonl files.")
    sample: Literal["customers", "documents", "reviews", "quotes"] | None = Field(
        default=None, description="Generate this built-in sample dataset at `path` on first use if it is missing."
    )
    sample_rows: int = Field(
        default=2000, ge=1, description="Rows of sample data to generate in all (daily partitioning: per day)."
    )
    batch_rows: int = Field(default=4096, ge=1, description="Rows per record batch while streaming the source.")
    types: dict[str, str] = Field(
        default_factory=dict,
        description="Declared Arrow types of source columns, e.g. {price: float64, title: string} (aliases: string, "
        "int64, float64, bool, date32, timestamp[s], ...). A value that does not convert (\"12,99\" in a float64 "
        "column) is a row error naming the file, row and value, kept in the dead letters; the read fails only when "
        "such rows are more than runtime.max_error_fraction of the partition. Undeclared columns keep the reader's "
        "types (csv: text; parquet: the file's; jsonl: text for the columns the model reads as text, else those of "
        "the file's first block). Columns not in "
        "`columns` are never read, whatever they hold. See docs/reading-data.md.",
    )
    block_size: int = Field(
        default=1 << 20,
        ge=1024,
        description="csv / jsonl: bytes parsed at a time (memory per block). A line longer than this still reads: "
        "the block grows to hold it.",
    )
    asset: str | None = Field(
        default=None,
        description="An asset of your Dagster project whose partitions this pipeline reads: its key (\"a/b\" for a "
        "multi-part key); `path` says where it writes each partition ({partition}). The pipeline's raw asset "
        "depends on it in the asset graph (partition_mapping) and, unless the spec has `automation:` (or a "
        "schedule or sensor), runs when it is materialized (declarative automation: automation.condition "
        "on_upstream_update), once per content of the upstream partition. See docs/reading-data.md.",
    )
    partition_mapping: Literal["identity"] = Field(
        default="identity",
        description="source.asset: how the upstream asset's partitions map to this pipeline's. identity: partition "
        "K reads upstream partition K, so both assets need the same partitions (the same daily start and "
        "timezone, the same static keys, or dynamic partitions named after this pipeline).",
    )


    @model_validator(mode="before")
    @classmethod
    def _file_columns_by_default(cls, data: Any) -> Any:
        """A files source has fixed columns: `columns` may be left out (all four)."""
        if isinstance(data, dict) and data.get("format") == "files" and "columns" not in data:
            return {**data, "columns": list(FILE_COLUMNS)}
        return data

    @model_validator(mode="after")
    def _files_rules(self) -> "SourceSpec":
        """What a files source reads is fixed: its columns, their types; the text settings do not apply."""
        if self.format != "files":
            return self
        problems = []
        unknown = [c for c in self.columns if c not in FILE_COLUMNS]
        if unknown:
            problems.append(f"columns: {', '.join(map(repr, unknown))} is not a column of a files source (one row "
                            f"per file: {', '.join(FILE_COLUMNS)}); name the file's column, or leave columns out")
        for name in ("types", "sample"):
            if getattr(self, name):
                problems.append(f"{name}: does not apply to a files source (one row per file, with fixed columns "
                                f"and types): remove it")
        if problems:
            raise ValueError("; ".join(problems))
        return self

class PartitionDimensionSpec(_Strict):
    """One dimension of `kind: multi` partitioning (two of them: a day or a set of keys, crossed with keys)."""

    name: str = Field(description="multi: the dimension's name, an identifier (e.g. date, app); {name} in "
                      "source.path is replaced by this dimension's key.")
    kind: Literal["daily", "static", "dynamic"] = Field(
        description="multi: daily (one key per day, YYYY-MM-DD), static (the keys listed) or dynamic (keys added "
        "at run time: the UI, a sensor, `add_partitions`).")
    keys: list[str] | None = Field(default=None, description="multi, static dimension: its keys.")
    start_date: str | None = Field(default=None, description="multi, daily dimension: first day, YYYY-MM-DD.")
    end_date: str | None = Field(default=None, description="multi, daily dimension: day after the last one.")
    timezone: str = Field(default="UTC", description="multi, daily dimension: timezone of the day boundaries.")


class PartitioningSpec(_Strict):
    kind: Literal["static", "hash", "daily", "dynamic", "multi"] = Field(
        description="static, hash, daily, dynamic, or multi: two dimensions crossed (e.g. day x app), each "
        "partition key being the two dimension keys joined by '|' in the order of the dimension NAMES "
        "(app and date: 'android|2026-11-01'). See docs/concepts.md, 'Two-dimensional partitions'.")
    dimensions: list[PartitionDimensionSpec] | None = Field(
        default=None,
        description="multi: exactly two dimensions; at most one daily; static and dynamic keys must not hold "
        "'|', ',', '[' or ']'. source.path names each dimension as {<name>} (e.g. "
        "data/reviews/{date}/{app}.jsonl).",
    )

    def time_dimension(self) -> PartitionDimensionSpec | None:
        """multi: the daily dimension, if there is one (a schedule ticks over it)."""
        return next((d for d in self.dimensions or [] if d.kind == "daily"), None) if self.kind == "multi" else None

    def day_timezone(self) -> str:
        """The timezone of the day boundaries: daily's, or a multi partitioning's daily dimension's."""
        dim = self.time_dimension()
        return dim.timezone if dim is not None else self.timezone
    keys: list[str] | None = Field(
        default=None,
        description="static: the partition keys, each substituted for {partition} in source.path. When omitted, "
        "one partition per file matching source.path (with {partition} as the wildcard) at definition load.",
    )
    count: int | None = Field(default=None, ge=1, description="hash: number of shards over all source rows.")
    start_date: str | None = Field(default=None, description="daily: first day, YYYY-MM-DD.")
    end_date: str | None = Field(default=None, description="daily: day after the last one (default: open-ended).")
    timezone: str = Field(default="UTC", description="daily: timezone of the day boundaries.")
    time_column: str | None = Field(
        default=None,
        description="daily: the column holding each row's timestamp. Without {partition} in source.path a day is "
        "the rows of every file whose timestamp falls in it; with {partition} (one file per day) it is the day's "
        "file, and `day_check` says what to do with a row of that file stamped with another day.",
    )
    day_check: Literal["fail", "keep"] = Field(
        default="fail",
        description="daily, one file per day, with time_column: a row whose timestamp is not in its file's day "
        "fails the read naming the file, row and value ('fail'), or is kept in the file's day ('keep').",
    )


class PrepareSpec(_Strict):
    id_column: str | None = Field(
        default=None,
        description="Column holding a stable, unique row id. Without it the id is '<file name>:<row number>' "
        "(multi partitioning: the file's path from the first placeholder on, '2026-11-01/android.jsonl:3').",
    )
    duplicate_ids: Literal["fail", "keep_first", "keep_last"] = Field(
        default="fail",
        description="With id_column, an id that occurs more than once in a partition: 'fail': the read fails, "
        "naming the id, its files and rows; 'keep_first' / 'keep_last': the first / last occurrence in read order "
        "(files in order, rows in order) is kept and the others dropped before anything reaches the model; the "
        "count and samples go to the read stage's metadata (duplicate_ids, duplicate_rows_dropped, "
        "duplicate_samples).",
    )
    template: str | None = Field(
        default=None,
        description="generate: user prompt with {column} fields. embed / classify (instead of text_column): the "
        "text made of several columns, e.g. '{subject}\\n\\n{body}'; a blank field renders empty, and a row is an "
        "empty input only when every field is blank.",
    )
    system: str | None = Field(default=None, description="generate: optional system message.")
    text_column: str | None = Field(
        default=None, description="embed / classify: the column holding the text (or use template for several)."
    )
    input_columns: list[str] | None = Field(
        default=None, description="predict: columns handed to the model class (default: all source columns); "
        "transcribe: the one column holding each row's audio file path or s3:// URL (file_path)."
    )
    image_columns: list[str] = Field(
        default_factory=list,
        description="generate / image tasks: columns holding images (bytes, local paths, s3:// or http(s):// URLs).",
    )
    image_max_side: int = Field(default=768, ge=16, description="Images are resized to fit this many pixels.")
    file_columns: list[str] = Field(
        default_factory=list,
        description="generate: columns holding PDF files (local paths or s3:// URLs, e.g. a files source's "
        "file_path) sent whole to the model as file parts, for a provider that reads PDFs itself (openai). A file "
        "that is missing, not a PDF, encrypted or over 32 MiB is a row error naming it. See docs/files-as-data.md.",
    )
    max_input_tokens: PositiveInt | Literal["model"] | None = Field(
        default=None,
        description="embed / classify / generate: the longest input sent to the model, in the model's tokens (the "
        "text; for generate the filled-in prompt, without chat template or system message). 'model': the model's "
        "own limit (its max_seq_length; for generate the context left after the template and max_new_tokens). "
        "Unset: no check, the model handles long inputs its own way (see docs/RELIABILITY.md).",
    )
    too_long: Literal["truncate", "skip", "fail"] = Field(
        default="truncate",
        description="With max_input_tokens, an input over it is: 'truncate': cut to the limit, sent, and flagged "
        "true in the `input_truncated` output column; 'skip': not sent, a row error (dead-lettered); 'fail': the "
        "step fails before any model call, naming the row.",
    )

    transforms: dict[str, ColumnTransform] = Field(
        default_factory=dict,
        description="Per source column: cast, strip_html, normalize, fill_null, required (applied in that order, "
        "before the template is filled in); see docs/transforms.md.",
    )
    join: dict[str, JoinSpec] = Field(
        default_factory=dict,
        description="New columns made by joining source columns (missing values skipped), e.g. "
        "{text: {columns: [title, description], separator: '\\n\\n'}}; text_column and template may name them.",
    )
    documents: dict[str, DocumentSpec] = Field(
        default_factory=dict,
        description="New text columns, each the text of the document file (PDF, HTML, Markdown, text) named by a "
        "column of paths or URLs, e.g. {contract_text: {column: file_path}}; template / text_column may name them. "
        "Extracted after the transforms, before the joins; a missing, encrypted or damaged file is a row error "
        "naming the file. See docs/files-as-data.md.",
    )
    function: str | None = Field(
        default=None,
        description="'package.module:function' called on each Arrow RecordBatch after the transforms and joins; it "
        "returns a RecordBatch of the same rows in the same order (row_id kept), and may add columns (declare them "
        "in function_columns) and a string column `_row_error` (non-null: that row is a row error with that reason). "
        "See docs/transforms.md.",
    )
    function_columns: list[str] = Field(
        default_factory=list, description="Columns prepare.function adds, which text_column / template may name."
    )
    trial: TrialSpec | None = Field(
        default=None,
        description="A trial run on a few rows: {limit: N} and/or {sample: fraction, seed: S}. The partition is "
        "marked trial (metadata, lineage, output written under <sink>/_trial) and a later run without trial redoes "
        "it in full.",
    )

    def template_fields(self) -> list[str]:
        if not self.template:
            return []
        return [field for _, field, _, _ in string.Formatter().parse(self.template) if field]

    def derived_columns(self) -> list[str]:
        """Columns the prepare stage makes (joins, the user function), which text_column and template may name."""
        return [*self.documents, *self.join, *self.function_columns]


class GenerationParamsSpec(_Strict):
    max_new_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None


class TaskSpec(_Strict):
    kind: Literal["embed", "generate", "classify", "predict", "embed_image", "classify_image", "transcribe"]
    output_column: str | None = Field(
        default=None, description="Where the model output goes (default by kind: embedding, generated_text, label, "
        "text for transcribe, which also writes language, duration_s and segments)."
    )
    params: GenerationParamsSpec = Field(default_factory=GenerationParamsSpec, description="generate: sampling.")
    labels: list[str] | None = Field(
        default=None,
        description="generate: normalise the answer to one of these labels (else `default_label`) into "
        "`label_column`; classify: the candidate labels.",
    )
    label_column: str | None = Field(default=None, description="generate with labels: the normalised label column.")
    default_label: str = Field(default="Other", description="generate with labels: when no label matches.")
    structured: StructuredOutput | None = Field(
        default=None,
        description="generate: structured output (choices / regex / json_schema / pydantic_model, unnest); see "
        "docs/structured-outputs.md.",
    )
    structured_column: str = Field(
        default="parsed", description="generate with structured: the column for the validated value (unless unnest)."
    )
    output_types: dict[str, str] | None = Field(
        default=None,
        description="predict: the model's output columns and their Arrow types (aliases such as string, int64, "
        "float64, bool). Checked at load (names) and by the blocking `output_schema` check (types). Without it the "
        "type of each output column is the one its chunks agree on (all-null chunks do not count).",
    )

    def resolved_output_column(self) -> str:
        return self.output_column or TASKS[self.kind].default_output


class PricingSpec(_Strict):
    """What the model costs, for the estimated cost in the infer asset's metadata (local models: leave at 0)."""

    input_per_million_tokens: float = Field(default=0.0, ge=0, description="Price (USD) of 1M prompt tokens.")
    output_per_million_tokens: float = Field(default=0.0, ge=0, description="Price (USD) of 1M generated tokens.")
    batch_input_per_million_tokens: float | None = Field(
        default=None, ge=0, description="Batch mode (model.config batch_api): price of 1M prompt tokens answered "
        "through the provider's batch API. None: half the online price (OpenAI's and Anthropic's batch discount).")
    batch_output_per_million_tokens: float | None = Field(
        default=None, ge=0, description="Batch mode: price of 1M generated tokens. None: half the online price.")

    def cost(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.input_per_million_tokens + tokens_out * self.output_per_million_tokens) / 1e6

    def batch_cost(self, tokens_in: int, tokens_out: int) -> float:
        price_in = self.batch_input_per_million_tokens
        price_out = self.batch_output_per_million_tokens
        return (tokens_in * (self.input_per_million_tokens / 2 if price_in is None else price_in)
                + tokens_out * (self.output_per_million_tokens / 2 if price_out is None else price_out)) / 1e6


class ModelSpec(_Strict):
    provider: str = Field(description=f"One of: {', '.join(sorted(PROVIDERS))}.")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="The provider resource's fields. A value {env: NAME} is read from the environment at run time "
        "(dg.EnvVar): use it for every secret.",
    )
    pricing: PricingSpec = Field(
        default_factory=PricingSpec, description="Per-token prices of a paid API; the estimated cost is 0 without."
    )


class SinkSpec(_Strict):
    path: str | None = Field(
        default=None,
        description="Folder or s3:// prefix for outputs (default: <storage root>/<pipeline>/output); for lancedb "
        "the database folder or s3:// URI. A relative folder resolves as source.path does.",
    )
    format: Literal[tuple(SINKS)] = Field(
        default="parquet",
        description="parquet / jsonl / csv: one file per partition. lancedb: one vector-store table, each row "
        "tagged with its partition_key; a re-materialized partition replaces its rows in one commit.",
    )
    columns: list[str] | None = Field(default=None, description="Columns to keep, in order (default: all).")
    table: str | None = Field(default=None, description="lancedb: the table name (default: the pipeline name).")


class Toleration(_Strict):
    """A Kubernetes toleration (core/v1 Toleration), e.g. for the taint a GPU node pool carries."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


def parse_quantity(value: str | int, field_name: str) -> Decimal:
    """A Kubernetes quantity ('500m', '16Gi', '2') as a number, with the kubernetes client's own parser."""
    try:
        from kubernetes.utils.quantity import parse_quantity as k8s_parse  # the kubernetes client: slow to import
    except ImportError:  # runtime.resources sizes Kubernetes Jobs: the k8s extra brings the client
        raise ValueError(f"{field_name} {value!r}: reading Kubernetes quantities needs the 'kubernetes' package, "
                         'which is not installed. Install it with: pip install "batch-assets[k8s]"') from None

    try:
        return k8s_parse(value)
    except ValueError:
        raise ValueError(
            f"{field_name} {value!r} is not a Kubernetes quantity (examples: '4', '500m', '16Gi', '2G')"
        ) from None


def _check_quantity(value: str | None, field: str) -> str | None:
    if value is None:
        return None
    parse_quantity(value, field)
    return value


def replicas_problem(provider: str, config: dict[str, Any]) -> str | None:
    """Why `gpu_strategy: replicas` cannot run with this provider and config, or None when it can (each provider
    declares `runs_replicas` and its config's problems, resources/base.py)."""
    cls = provider_class(provider)
    if not cls.runs_replicas:
        return (f"the {provider!r} provider runs one model in one process; replicas are run by the "
                f"{' and '.join(repr(p) for p in replica_providers())} providers")
    return cls.replicas_config_problem(config)


def replica_providers() -> list[str]:
    """The providers that run `gpu_strategy: replicas` (one model copy per GPU inside the step's pod)."""
    return [name for name in PROVIDERS if provider_class(name).runs_replicas]


class InferResources(_Strict):
    """What one infer step's pod asks for. Unset fields fall back to the policy's default."""

    gpus: int | None = Field(default=None, ge=0, description="nvidia.com/gpu request and limit (and model parallelism).")
    cpu: str | None = Field(default=None, description="CPU request, a Kubernetes quantity: '4', '500m'.")
    memory: str | None = Field(default=None, description="Memory request and limit, a Kubernetes quantity: '16Gi'.")
    node_selector: dict[str, str] | None = Field(default=None, description="Node labels the pod must land on.")
    tolerations: list[Toleration] | None = Field(default=None, description="Taints the pod tolerates.")
    gpu_strategy: Literal["tensor_parallel", "replicas"] | None = Field(
        default=None,
        description="How a step with several GPUs uses them: 'tensor_parallel' shards one model over all of them "
        "(vLLM; the pod gets a memory-backed /dev/shm for NCCL), 'replicas' runs one model copy per GPU and splits "
        "each chunk's rows across them (providers vllm and sentence_transformers; others are refused). Default: "
        "tensor_parallel. Checked against the provider and, where it can tell, the model (docs/deployment.md).",
    )

    @model_validator(mode="after")
    def _quantities(self) -> "InferResources":
        _check_quantity(self.cpu, "cpu")
        _check_quantity(self.memory, "memory")
        return self


class SizeRule(InferResources):
    """Partitions at least this large get these resources (size from source metadata, read without the rows)."""

    min_rows: int | None = Field(default=None, ge=0, description="Rows, from Parquet footers (parquet sources).")
    min_bytes: int | str | None = Field(
        default=None, description="Bytes of the partition's source files: an int or a quantity like '2Gi', '500M'."
    )

    @model_validator(mode="after")
    def _one_threshold(self) -> "SizeRule":
        if (self.min_rows is None) == (self.min_bytes is None):
            raise ValueError("a size rule needs exactly one of min_rows or min_bytes")
        if isinstance(self.min_bytes, str):
            _check_quantity(self.min_bytes, "min_bytes")
        return self


class InferResourcePolicy(_Strict):
    default: InferResources = Field(default_factory=InferResources, description="Every partition's resources.")
    partitions: dict[str, InferResources] = Field(
        default_factory=dict,
        description="Overrides by partition key or glob pattern ('2025-01-*'); an exact key wins over patterns, "
        "else the first matching pattern in the order written. Applied after by_size.",
    )
    by_size: list[SizeRule] = Field(
        default_factory=list,
        description="Overrides by partition size; every rule whose threshold the partition reaches applies, in "
        "the order written (list them small to large).",
    )


class EvaluationSpec(_Strict):
    """A golden slice: a source column holding each row's true label, compared with the model's answer."""

    label_column: str = Field(
        description="Source column with the true label. It is read and carried to the outputs but never reaches "
        "the model (not in the prompt, text or inputs); rows where it is empty are not scored."
    )
    prediction_column: str | None = Field(
        default=None,
        description="Column holding the model's answer (default: the structured choice / normalised label column "
        "for generate, the label column for classify, the output column for predict).",
    )
    min_accuracy: float | None = Field(
        default=None, ge=0, le=1, description="The evaluation check fails below this accuracy (0-1)."
    )
    severity: Literal["warn", "error"] = Field(
        default="warn", description="How a failed evaluation check shows in Dagster (error blocks downstream).",
    )


class RuntimeSpec(_Strict):
    chunk_rows: int = Field(
        default=512,
        ge=1,
        description="Rows handed to the model per call. Hundreds per call let providers sort by length and batch; "
        "memory stays bounded by this, not by the partition size.",
    )
    gpus: int = Field(
        default=0, ge=0, description="Shorthand for resources.default.gpus: GPUs each infer step asks for."
    )
    max_error_fraction: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="The most rows of a partition the model may fail on (errors after retries, invalid outputs) "
        "before the blocking `error_rate` check fails the infer step and nothing is published. Rows whose input "
        "was empty are reported, not counted. The read stage holds the rows whose values do not convert to "
        "source.types against the same fraction (docs/reading-data.md).",
    )
    stop_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="When a run is stopped (Terminate in the UI, SIGTERM, Ctrl-C) no new model request starts; "
        "requests already in flight get this many seconds to answer (their answers are kept), then are abandoned "
        "(docs/RELIABILITY.md, 'Stopping a run').",
    )
    response_cache: bool = Field(
        default=False,
        description="Keep every successful model answer under <storage root>/_cache, keyed by model, parameters and "
        "prepared input, and reuse it in any later run, partition or pipeline (batch_assets/reliability/cache.py).",
    )
    resources: InferResourcePolicy = Field(
        default_factory=lambda: InferResourcePolicy(),
        description="What the infer step's Kubernetes Job asks for, per partition (see docs/deployment.md). Only "
        "the batch Kubernetes executor applies it; read / prepare / write steps never ask for a GPU.",
    )

    pool: str | None = Field(
        default=None,
        description="Dagster pool of the infer step (caps concurrent infer steps across runs). Default: one pool "
        "per external endpoint ('endpoint:<host>'), 'gpu' when any partition asks for a GPU, else none "
        "(batch_assets/orchestration/execution/pools.py).",
    )
    progress_every_s: float = Field(
        default=10.0,
        ge=0,
        description="The infer step logs rows done / total, rows/s and ETA at most this often, when another 5% of the "
        "partition is done or a minute (6 x this) has passed; 0 logs after every chunk (tests).",
    )

    @model_validator(mode="after")
    def _one_default_gpu_count(self) -> "RuntimeSpec":
        default = self.resources.default
        if self.gpus and default.gpus is not None and default.gpus != self.gpus:
            raise ValueError(
                f"runtime.gpus ({self.gpus}) and runtime.resources.default.gpus ({default.gpus}) disagree: set one"
            )
        return self

    def default_resources(self) -> InferResources:
        """The policy's default with `runtime.gpus` filled in."""
        default = self.resources.default
        return default if default.gpus is not None else default.model_copy(update={"gpus": self.gpus})

    def max_gpus(self) -> int:
        """The most GPUs any partition can ask for (0: a CPU pipeline)."""
        overrides = [*self.resources.partitions.values(), *self.resources.by_size]
        return max([self.default_resources().gpus or 0] + [o.gpus or 0 for o in overrides])



class BackfillSpec(_Strict):
    policy: Literal["single_run", "multi_run"] = Field(
        default="single_run",
        description="single_run: a backfill (or --partition-range run) processes its whole range in one run, so the "
        "model loads once; multi_run: one run per `max_partitions_per_run` partitions (smaller failure blast "
        "radius, runs spread over the queue).",
    )
    max_partitions_per_run: int = Field(default=1, ge=1, description="multi_run: partitions per run.")


class ScheduleSpec(_Strict):
    """daily partitioning (or multi with a daily dimension: every key of the other dimension) only: each tick
    materializes the newest complete day (see batch_assets/orchestration/launch/schedules.py)."""

    cron: str = Field(default="30 1 * * *", description="When ticks fire, a cron string (default 01:30 daily).")
    timezone: str | None = Field(default=None, description="Timezone of the cron (default: partitioning.timezone).")
    running: bool = Field(default=True, description="Start running when the code location loads (else stopped "
                          "until switched on in the UI or with `dagster schedule start`).")


class SensorSpec(_Strict):
    """Watch source.path ({partition} as the wildcard) for new or rewritten files (see batch_assets/orchestration/launch/sensors.py)."""

    ready: Literal["min_age", "marker"] = Field(
        default="min_age",
        description="min_age: a file is complete once unmodified for min_age_seconds; marker: once a `marker` file "
        "in its folder is at least as new as it (the _SUCCESS convention of Spark/Hadoop writers).",
    )
    min_age_seconds: float = Field(default=30.0, ge=0, description="min_age: seconds a file must be left unchanged.")
    marker: str = Field(default="_SUCCESS", description="marker: the marker file's name, in the data file's folder.")
    interval_seconds: int = Field(default=30, ge=1, description="Seconds between sensor evaluations.")
    max_runs_per_tick: int = Field(
        default=10, ge=1, description="Throttle: new partitions (one run each) requested per evaluation; the rest "
        "wait for later ticks, oldest file first.",
    )
    max_queued_runs: int = Field(
        default=50, ge=1, description="Back-pressure: request nothing while this many runs of the pipeline are "
        "queued or starting.",
    )
    running: bool = Field(default=True, description="Start running when the code location loads.")


class AutomationSpec(_Strict):
    """Dagster's declarative automation on the pipeline's four assets (see batch_assets/orchestration/assets/automation.py): an
    automation sensor evaluates the condition and launches what it asks for. Lineage records still make every run
    skip a partition already made from the same source and spec, so a requested run never pays twice."""

    condition: Literal["on_missing", "on_cron", "on_upstream_update"] = Field(
        description="on_upstream_update (the default with source.asset): run a partition each time the upstream "
        "asset's partition is materialized (Dagster's any_deps_updated, not limited to the newest day), once per "
        "request; a partition whose upstream bytes did not change skips every stage (no model call). on_missing (Dagster's AutomationCondition.on_missing()): materialize each partition that "
        "appears after automation is switched on, once (daily: each day as it ends; dynamic: each key added; static "
        "from files: each new file's, at the next code location reload), when "
        "it has never been materialized in this Dagster instance; partitions already missing at switch-on are a "
        "backfill's job. on_cron: at every tick of `cron`, request the partitions (daily: the newest day), each "
        "stage once its upstream stage has updated since the tick; already-published partitions skip every stage.",
    )
    cron: str | None = Field(default=None, description="on_cron: when ticks fire, a cron string like '0 2 * * *'.")
    timezone: str | None = Field(default=None, description="on_cron: timezone of the cron (default: "
                                 "partitioning.timezone).")
    interval_seconds: int = Field(default=30, ge=5, description="Seconds between evaluations of the condition.")
    running: bool = Field(default=True, description="Start the automation sensor running when the code location "
                          "loads (else stopped until switched on in the UI's Automation page).")


class RetrySpec(_Strict):
    """Step retries for transient failures (network, OOM-killed worker, provider 5xx); bad input is never retried."""

    max_retries: int = Field(default=2, ge=0, description="Retries of a failed step (0: none).")
    delay_seconds: float = Field(default=15.0, ge=0, description="Wait before the first retry.")
    backoff: Literal["exponential", "linear"] = Field(default="exponential", description="How the wait grows.")
    jitter: bool = Field(default=True, description="Randomise waits (+/-) so retries of many runs spread out.")


class PipelineSpec(_Strict):
    # source.path / sink.path as the spec file wrote them, before anchor_local_paths made them absolute: the
    # stages' code versions digest these, so moving the project (or upgrading from before paths were anchored)
    # does not make every published partition stale and paid for again (orchestration/assets/lineage.py).
    _written_paths: dict[str, str] = PrivateAttr(default_factory=dict)  # anchored path -> as written

    name: str = Field(description="Identifier: lower case, digits and underscores.")
    description: str = ""
    source: SourceSpec
    partitioning: PartitioningSpec
    prepare: PrepareSpec = Field(default_factory=PrepareSpec)
    task: TaskSpec
    model: ModelSpec
    sink: SinkSpec = Field(default_factory=SinkSpec)
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    backfill: BackfillSpec = Field(default_factory=BackfillSpec)
    schedule: ScheduleSpec | None = Field(default=None, description="daily partitioning, or multi with a daily "
                                         "dimension: a schedule (optional).")
    sensor: SensorSpec | None = Field(default=None, description="A sensor on new source files (optional).")
    automation: AutomationSpec | None = Field(
        default=None, description="Dagster's declarative automation (on_missing, on_cron) instead of a schedule or "
        "sensor (optional); see docs/launch-paths.md.")
    retries: RetrySpec = Field(default_factory=RetrySpec)
    evaluation: EvaluationSpec | None = Field(
        default=None, description="Score the answers against a labelled column; see docs/evaluation.md."
    )

    def model_input_columns(self) -> list[str]:
        """predict: the columns handed to the model class; the evaluation label never is."""
        held_out = self.evaluation.label_column if self.evaluation else None
        return [c for c in (self.prepare.input_columns or self.source.columns) if c != held_out]

    def prediction_column(self) -> str | None:
        """The column the evaluation scores (None when the task predicts no label)."""
        if self.evaluation and self.evaluation.prediction_column:
            return self.evaluation.prediction_column
        return TASKS[self.task.kind].prediction_column(self)

    @model_validator(mode="after")
    def _cross_check(self) -> "PipelineSpec":
        problems: list[tuple[str, str]] = []
        if not NAME_RE.match(self.name):
            problems.append(("name", f"{self.name!r} must match {NAME_RE.pattern}"))
        columns = set(self.source.columns)
        known = ", ".join(self.source.columns)
        prep, task = self.prepare, self.task

        def need_column(field: str, column: str | None) -> None:
            if column is not None and column not in columns:
                problems.append((field, f"column {column!r} is not in source.columns ({known})"))

        for column, alias in self.source.types.items():
            need_column(f"source.types.{column}", column)
            if _arrow_type_problem(alias):
                problems.append((f"source.types.{column}", _arrow_type_problem(alias)))
        need_column("prepare.id_column", prep.id_column)
        problems += _prepare_problems(self, columns, known)
        columns_prepared = columns | set(prep.derived_columns())
        if prep.text_column is not None and prep.text_column not in columns_prepared:
            problems.append(("prepare.text_column", f"column {prep.text_column!r} is not in source.columns ({known})"
                             + (f" nor made by prepare.join / function_columns" if prep.derived_columns() else "")))
        need_column("partitioning.time_column", self.partitioning.time_column)
        for col in prep.input_columns or []:
            need_column("prepare.input_columns", col)
        for col in prep.image_columns:
            need_column("prepare.image_columns", col)
        for col in prep.file_columns:
            need_column("prepare.file_columns", col)
        for field in prep.template_fields():
            if not field.isidentifier():
                problems.append(("prepare.template", f"field {{{field}}} must be a plain column name"))
            elif field not in columns_prepared:
                made = f"; made in prepare: {', '.join(prep.derived_columns())}" if prep.derived_columns() else ""
                problems.append(("prepare.template", f"unknown column {{{field}}}; source.columns are: {known}{made}"))

        kind = TASKS[task.kind]
        problems += kind.spec_problems(self)  # what the task kind needs from the rest of the spec

        part = self.partitioning
        if part.kind == "hash" and not part.count:
            problems.append(("partitioning.count", "hash partitioning needs count (number of shards)"))
        if part.kind == "daily" and not part.start_date:
            problems.append(("partitioning.start_date", "daily partitioning needs start_date (YYYY-MM-DD)"))
        needs_token = part.kind in ("static", "dynamic") or (part.kind == "daily" and not part.time_column)
        if needs_token and part.kind != "static" and PARTITION_TOKEN not in self.source.path:
            problems.append(("source.path", f"{part.kind} partitioning needs {PARTITION_TOKEN} in the path"))
        if part.kind == "static" and part.keys and PARTITION_TOKEN not in self.source.path:
            problems.append(("source.path", f"static keys are substituted for {PARTITION_TOKEN}: add it to the path"))
        if part.kind == "hash" and PARTITION_TOKEN in self.source.path:
            problems.append(("source.path", "hash shards read every file: remove {partition} from the path"))
        problems += multi_partition_problems(self)

        secret_literals = literal_secrets(self.model.config)
        if secret_literals:
            problems.append(("model.config", literal_secret_problem(secret_literals)))
        problems += _orchestration_problems(self)

        if self.source.format != "parquet" and any(r.min_rows is not None for r in self.runtime.resources.by_size):
            problems.append(("runtime.resources.by_size", "min_rows is read from Parquet footers: for a "
                             f"{self.source.format} source use min_bytes"))
        if part.kind == "daily" and part.time_column and self.runtime.resources.by_size:
            problems.append(("runtime.resources.by_size", "a day filtered from a time column has no size of its "
                             "own in the source metadata: use partitions overrides instead"))
        policy = self.runtime.resources
        if any(r.gpu_strategy == "replicas" for r in (policy.default, *policy.partitions.values(), *policy.by_size)):
            problem = replicas_problem(self.model.provider, self.model.config)
            if problem is not None:
                problems.append(("runtime.resources.gpu_strategy", f"'replicas', but {problem}"))
        if self.model.provider not in PROVIDERS:
            problems.append(("model.provider", f"unknown provider {self.model.provider!r}; known: {', '.join(sorted(PROVIDERS))}"))
        else:
            problems += provider_config_problems(self.model.provider, self.model.config)
            if not supports(provider_class(self.model.provider), task.kind):
                problems.append(("task.kind", f"provider {self.model.provider!r} cannot run task {task.kind!r}"))
            if prep.file_columns and not provider_class(self.model.provider).accepts_file_parts:
                problems.append(("prepare.file_columns", f"provider {self.model.provider!r} does not take documents "
                                 "as file parts: use prepare.documents to send their text instead"))

        reserved_source = sorted(RESERVED_COLUMNS & columns)
        if reserved_source:
            problems.append(("source.columns", f"{reserved_source} are reserved by the pipeline "
                             f"({', '.join(sorted(RESERVED_COLUMNS))}): rename them in the source or select others"))
        outputs = {"task.output_column": task.output_column, "task.label_column": task.label_column,
                   "task.structured_column": task.structured_column if task.structured else None,
                   **{f"task.output_types.{k}": k for k in task.output_types or {}}}
        for field, name in outputs.items():
            if name is not None and (name in RESERVED_COLUMNS or name.startswith("_")):
                problems.append((field, f"{name!r} is reserved (pipeline columns: {', '.join(sorted(RESERVED_COLUMNS))}"
                                 "; names starting with '_' are internal): choose another name"))
        for name, alias in (task.output_types or {}).items():
            if _arrow_type_problem(alias):
                problems.append((f"task.output_types.{name}", _arrow_type_problem(alias)))
        produced = {"error", "row_id", *kind.produced(self)}
        clash = sorted(produced & columns)
        if clash:
            problems.append(("task.output_column", f"output column(s) {clash} would overwrite source columns: rename"))
        if self.evaluation is not None:
            problems += self._evaluation_problems(columns, known)
        problems += sink_for(self.sink.format).spec_problems(self)  # stages/sinks/<format>.py
        if problems:
            raise ValueError("; ".join(f"{field}: {msg}" for field, msg in problems))
        return self

    def _evaluation_problems(self, columns: set[str], known: str) -> list[tuple[str, str]]:
        label = self.evaluation.label_column  # type: ignore[union-attr]
        prep = self.prepare
        if label not in columns:
            return [("evaluation.label_column", f"column {label!r} is not in source.columns ({known})")]
        # The golden label must never reach the model: a prompt, text or input that holds it is an answer key.
        uses = {
            "prepare.template": label in prep.template_fields(),
            "prepare.text_column": prep.text_column == label,
            "prepare.join": any(label in join.columns for join in prep.join.values()),
            "prepare.input_columns": label in (prep.input_columns or []),
            "prepare.image_columns": label in prep.image_columns,
            "prepare.file_columns": label in prep.file_columns,
        }
        problems = [(field, f"uses the evaluation label column {label!r}: the model would see the answer")
                    for field, used in uses.items() if used]
        if TASKS[self.task.kind].prediction_column(self) is None:
            problems.append(("evaluation", f"task {self.task.kind!r} predicts no label to score"))
        return problems


def provider_config_problems(provider: str, config: dict[str, Any]) -> list[tuple[str, str]]:
    """A `model.config` key the provider's resource does not declare, named with the closest valid one: a typo
    (`batch_sise`) would otherwise run on with the default. Every provider is a resource class whose fields are
    its settings (resources/registry.py), a custom or user-registered one included."""
    import difflib

    known = sorted(provider_class(provider).model_fields)
    problems = []
    for key in config:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        problems.append((f"model.config.{key}", f"unknown setting {key!r} for provider {provider!r}: {hint}its "
                         f"settings are {', '.join(known)} (docs/spec-reference.md)"))
    return problems


def _arrow_type_problem(alias: str) -> str | None:
    import pyarrow as pa

    try:
        pa.type_for_alias(alias)
    except ValueError:
        return f"unknown Arrow type {alias!r} (e.g. string, int64, float64, bool, date32, timestamp[s])"
    return None


def _prepare_problems(spec: "PipelineSpec", columns: set[str], known: str) -> list[tuple[str, str]]:
    """The transforms, joins and function hook (batch_assets/spec_prepare.py) against the source's columns."""
    prep = spec.prepare
    problems = [(f"prepare.transforms.{name}", f"column {name!r} is not in source.columns ({known})")
                for name in prep.transforms if name not in columns]
    problems += join_output_problems(prep.join, columns)
    for name, doc in prep.documents.items():
        if doc.column not in columns:
            problems.append((f"prepare.documents.{name}", f"column {doc.column!r} is not in source.columns ({known})"))
        if name in columns:
            problems.append((f"prepare.documents.{name}", f"{name!r} is a source column: name the document's text "
                             "column anew"))
    made = prep.derived_columns()
    taken = sorted({c for c in made if c in RESERVED_COLUMNS or c.startswith("_")})
    if taken:
        problems.append(("prepare.join", f"{taken} are reserved names (or start with '_'): choose others"))
    if len(set(made)) != len(made) or set(prep.function_columns) & columns:
        problems.append(("prepare.function_columns", "a column the function adds may not repeat a source or "
                         "joined column: name it anew"))
    if prep.function_columns and not prep.function:
        problems.append(("prepare.function_columns", "names the columns prepare.function adds: set function"))
    if prep.function is not None:
        problem = function_problem(prep.function)
        if problem is not None:
            problems.append(("prepare.function", problem))
    return problems


def _orchestration_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from dagster._utils.schedules import is_valid_cron_string

    problems: list[tuple[str, str]] = []
    part = spec.partitioning
    if spec.schedule is not None:
        if part.kind != "daily" and not (part.kind == "multi" and part.time_dimension() is not None):
            problems.append(("schedule", "a schedule materializes the newest complete day: it needs daily "
                             "partitioning, or multi partitioning with a daily dimension"))
        if not is_valid_cron_string(spec.schedule.cron):
            problems.append(("schedule.cron", f"{spec.schedule.cron!r} is not a cron string like '30 1 * * *'"))
        try:
            ZoneInfo(spec.schedule.timezone or part.day_timezone())
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(("schedule.timezone", f"unknown timezone {spec.schedule.timezone!r}"))
    if spec.sensor is not None:
        if part.kind == "daily" and part.time_column and PARTITION_TOKEN not in spec.source.path:
            problems.append(("sensor", f"a sensor maps each new file to a partition through {PARTITION_TOKEN} in "
                             "source.path, and here a day is made of rows of any file (time_column): a new file "
                             "can change any day. Use `schedule:` instead (the newest complete day, once it has "
                             "ended), or write one file per day and put {partition} in source.path (time_column "
                             "then checks each row's day, see partitioning.day_check)"))
        elif part.kind == "multi":
            missing = [d.name for d in part.dimensions or [] if "{" + d.name + "}" not in spec.source.path]
            if missing:
                problems.append(("sensor", "a sensor maps each new file to a partition through each dimension's "
                                 "placeholder in source.path; put " + " and ".join("{" + m + "}" for m in missing)
                                 + " in it (e.g. data/reviews/{date}/{app}.jsonl)"))
        elif part.kind == "hash" or PARTITION_TOKEN not in spec.source.path:
            problems.append(("sensor", f"a sensor maps each new file to a partition through {PARTITION_TOKEN} in "
                             "source.path; this pipeline has no per-file partitions"))
        if spec.sensor.ready == "marker" and "/" in spec.sensor.marker:
            problems.append(("sensor.marker", "the marker is a file name in the data file's folder, not a path"))
    problems += _upstream_asset_problems(spec)
    auto = spec.automation
    if auto is not None:
        others = [name for name in ("schedule", "sensor") if getattr(spec, name) is not None]
        if others:
            problems.append(("automation", f"one automatic launcher per pipeline: drop `automation:` or "
                             f"`{'`/`'.join(others)}:`. Dagster's automation sensor does not see what a schedule "
                             "or sensor is about to request (nor they what it requests), so both would launch the "
                             "same partitions; on_missing covers a sensor's new partitions, on_cron a schedule"))
        if auto.condition == "on_upstream_update" and not spec.source.asset:
            problems.append(("automation.condition", "on_upstream_update runs the pipeline when its upstream asset "
                             "is materialized: name that asset in source.asset"))
        if auto.condition == "on_cron":
            if not auto.cron:
                problems.append(("automation.cron", "on_cron needs a cron string, like '0 2 * * *'"))
            elif not is_valid_cron_string(auto.cron):
                problems.append(("automation.cron", f"{auto.cron!r} is not a cron string like '0 2 * * *'"))
            try:
                ZoneInfo(auto.timezone or part.day_timezone())
            except (ZoneInfoNotFoundError, ValueError):
                problems.append(("automation.timezone", f"unknown timezone {auto.timezone!r}"))
        elif auto.condition == "on_missing" and (part.kind == "hash" or (part.kind == "static" and part.keys)):
            problems.append(("automation.condition", "on_missing requests partitions that appear after it is "
                             f"switched on, and this pipeline's partitions never change ({part.kind}"
                             f"{' keys listed in the spec' if part.kind == 'static' else ' shards'}): it would "
                             "never launch anything. Use a backfill for the partitions there are, or on_cron"))
        if auto.condition != "on_cron" and (auto.cron or auto.timezone):
            problems.append(("automation.cron", f"cron and timezone are for on_cron; {auto.condition} has no ticks"))
    return problems


PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Dagster joins a multi-partition key's dimension keys with '|' and lists keys with ',' and '[...]' (dagster's
# INVALID_STATIC_PARTITIONS_KEY_CHARACTERS): a key holding one would be split wrongly, or silently dropped.
MULTI_KEY_FORBIDDEN = ("|", ",", "[", "]")


def multi_partition_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """`partitioning.kind: multi`: two dimensions Dagster's MultiPartitionsDefinition accepts, each reachable from
    source.path. Checked here, at load, because Dagster's own errors come later (at a run) or never: a dynamic key
    with '|' is silently left out of the partitions."""
    part = spec.partitioning
    if part.kind != "multi":
        if part.dimensions is not None:
            return [("partitioning.dimensions", f"dimensions are for kind: multi, not {part.kind!r}")]
        return []
    problems: list[tuple[str, str]] = []
    for field in ("keys", "count", "start_date", "end_date", "time_column"):
        if getattr(part, field) is not None:
            problems.append((f"partitioning.{field}", f"kind: multi sets {field} on its dimension "
                             "(partitioning.dimensions), not on partitioning"))
    dims = part.dimensions or []
    if len(dims) != 2:
        return problems + [("partitioning.dimensions", f"kind: multi needs exactly two dimensions (Dagster's "
                            f"MultiPartitionsDefinition), e.g. a daily `date` and a static `app`; got {len(dims)}")]
    names = [d.name for d in dims]
    for i, dim in enumerate(dims):
        where = f"partitioning.dimensions.{i}"
        if not dim.name.isidentifier() or dim.name == "partition":
            problems.append((f"{where}.name", f"{dim.name!r} must be an identifier (letters, digits, _) other than "
                             "'partition': it is the {" + dim.name + "} placeholder of source.path"))
        if dim.kind == "daily" and not dim.start_date:
            problems.append((f"{where}.start_date", "a daily dimension needs start_date (YYYY-MM-DD)"))
        if dim.kind != "daily" and (dim.start_date or dim.end_date):
            problems.append((f"{where}.start_date", f"start_date / end_date are for a daily dimension, not {dim.kind}"))
        if dim.kind == "static" and not dim.keys:
            problems.append((f"{where}.keys", "a static dimension lists its keys"))
        if dim.kind != "static" and dim.keys is not None:
            problems.append((f"{where}.keys", f"keys are listed for a static dimension; a {dim.kind} dimension's "
                             "keys " + ("are days" if dim.kind == "daily" else "are added at run time")))
        for key in dim.keys or []:
            bad = [c for c in MULTI_KEY_FORBIDDEN if c in key]
            if bad or not key:
                problems.append((f"{where}.keys", f"key {key!r} " + (f"holds {' '.join(bad)}, which Dagster uses "
                                 "to join and list multi-partition keys: rename it" if bad else "is empty")))
        if dim.keys and len(set(dim.keys)) != len(dim.keys):
            problems.append((f"{where}.keys", "a key is listed twice"))
    if names[0] == names[1]:
        problems.append(("partitioning.dimensions", f"the two dimensions are both named {names[0]!r}"))
    if sum(d.kind == "daily" for d in dims) > 1:
        problems.append(("partitioning.dimensions", "at most one daily dimension: a day crossed with a day is not a "
                         "key of its own; cross the day with a static or dynamic dimension"))
    if sum(d.kind == "dynamic" for d in dims) > 1:
        problems.append(("partitioning.dimensions", "at most one dynamic dimension: a sensor could not tell which "
                         "of two new keys is which"))
    used = set(PLACEHOLDER_RE.findall(spec.source.path))
    unknown = sorted(used - set(names) - {"partition"})
    if unknown:
        problems.append(("source.path", f"placeholder(s) {', '.join('{' + u + '}' for u in unknown)} name no "
                         f"dimension (dimensions: {', '.join(names)}; {PARTITION_TOKEN} is the whole key)"))
    if "partition" not in used and not set(names) <= used:
        missing = [n for n in names if n not in used]
        problems.append(("source.path", "multi partitioning reads each partition's own files: put "
                         f"{' and '.join('{' + m + '}' for m in missing)} in the path (e.g. "
                         "data/reviews/{date}/{app}.jsonl)"))
    if spec.source.sample is not None:
        problems.append(("source.sample", "sample data is not generated for multi partitioning: point source.path "
                         "at your files"))
    problems += _multi_override_problems(dims, spec.runtime.resources.partitions)
    return problems


def _multi_override_problems(dims: list[PartitionDimensionSpec], overrides: dict[str, Any]) -> list[tuple[str, str]]:
    """`runtime.resources.partitions` keys of a multi pipeline: a key in the spec's dimension order (or with a
    part no dimension has) would never match, and the step would run on the default resources without a word."""
    from datetime import datetime

    ordered = sorted(dims, key=lambda d: d.name)  # Dagster's order of a key's parts
    shape = "|".join(f"<{d.name}>" for d in ordered)
    problems = []
    for pattern in overrides:
        parts = pattern.split("|")
        if len(parts) != 2:
            problems.append(("runtime.resources.partitions", f"{pattern!r} is not a two-dimensional key: write "
                             f"{shape} (dimension-name order), globs allowed, e.g. '{ordered[0].name}-key|*'"))
            continue
        for dim, part in zip(ordered, parts):
            if any(c in part for c in "*?["):
                continue
            if dim.kind == "static" and part not in (dim.keys or []):
                problems.append(("runtime.resources.partitions", f"{pattern!r}: {part!r} is not a key of dimension "
                                 f"{dim.name!r} ({', '.join(dim.keys or [])}); keys are {shape}"))
            elif dim.kind == "daily":
                try:
                    datetime.strptime(part, "%Y-%m-%d")
                except ValueError:
                    problems.append(("runtime.resources.partitions", f"{pattern!r}: {part!r} is not a day "
                                     f"(YYYY-MM-DD) of dimension {dim.name!r}; keys are {shape}"))
    return problems


ASSET_KEY_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-.]*$")


def _upstream_asset_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """source.asset: a key Dagster accepts, partitions that can map one to one, and one launcher. Whether the key
    exists and its partitions match are known only with the whole code location: orchestration/assets/upstream.py."""
    asset, part = spec.source.asset, spec.partitioning
    if asset is None:
        return []
    problems: list[tuple[str, str]] = []
    parts = asset.split("/")
    if not all(ASSET_KEY_PART.match(p) for p in parts):
        problems.append(("source.asset", f"{asset!r} is not an asset key: name parts of letters, digits and _ "
                         "joined by '/' (e.g. raw_app_reviews or reviews/raw)"))
    elif parts[0] == spec.name:
        problems.append(("source.asset", f"{asset!r} is one of this pipeline's own assets: name the asset of your "
                         "project that writes the source files"))
    if part.kind == "hash":
        problems.append(("source.asset", "hash shards have no upstream partition to map to: partition the "
                         "pipeline as the upstream asset is (daily, static or dynamic), or drop source.asset"))
    elif PARTITION_TOKEN not in spec.source.path and not (
            part.kind == "multi" and {d.name for d in part.dimensions or []} <= set(PLACEHOLDER_RE.findall(spec.source.path))):
        problems.append(("source.path", f"with source.asset, the path says where the upstream asset writes each "
                         f"partition: put {PARTITION_TOKEN} in it (e.g. data/{parts[-1]}/{PARTITION_TOKEN}.jsonl; "
                         "two-dimensional partitions: each {<dimension>})"))
    others = [name for name in ("schedule", "sensor") if getattr(spec, name) is not None]
    if others:
        problems.append(("source.asset", f"the pipeline runs when {asset!r} is materialized (declarative "
                         f"automation); `{'`/`'.join(others)}:` would launch the same partitions again: drop it, "
                         "or set `automation:` to choose another condition"))
    return problems


def parse_spec(data: dict[str, Any], origin: str = "<dict>") -> PipelineSpec:
    name = data.get("name", "?") if isinstance(data, dict) else "?"
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(spec)"
            msg = err["msg"].removeprefix("Value error, ")
            if isinstance(err.get("input"), (str, int, float)) and err["type"] != "value_error":
                msg += f" (got {err['input']!r})"
            lines.append(f"  - {loc}: {msg}")
        raise SpecError(f"pipeline {name!r} ({origin}) is invalid:\n" + "\n".join(lines)) from None


def load_spec(path: str | Path) -> PipelineSpec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"pipeline spec {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"pipeline spec {path} must be a mapping with name, source, partitioning, task, model")
    return anchor_local_paths(parse_spec(data, origin=str(path)), path)


def anchor_local_paths(spec: PipelineSpec, origin: str | Path) -> PipelineSpec:
    """The spec's relative local paths (source.path, sink.path) made absolute against the project its file belongs
    to (storage.project_root(origin): the pyproject.toml/dg.toml project at or above the spec file or defs.yaml).
    Resolved once, at load: whoever runs the pipeline later (a step process, a sensor, the CLI, from any cwd) reads
    and writes the same files, and every error names them in full."""
    for section in (spec.source, spec.sink):
        if section.path and not is_remote(section.path):
            anchored = resolve_local(section.path, origin)
            spec._written_paths[anchored] = spec._written_paths.get(section.path, section.path)
            section.path = anchored
    return spec


def written_path(spec: PipelineSpec, section: str) -> str | None:
    """source.path or sink.path as the spec wrote it (relative paths stay relative), for the code versions; a path
    changed after load is taken as it is."""
    path = getattr(spec, section).path
    return spec._written_paths.get(path, path) if path else path
