"""A pipeline spec's typed sections: source, partitioning, prepare, task, model, sink, runtime, launchers.

The pure schema: each section checks only itself (types, ranges, a field that needs another of the same section), and
its choices come from the tables below it (registries.py for source and sink formats and sample data, tasks.TASKS for
task kinds, resources.registry.PROVIDERS for providers). `PipelineSections` is the whole spec as the plug-ins see it
(source and sink formats, partition kinds: they sit above this module and read these fields); the checks that need
the whole pipeline and the plug-ins' own rules live one layer up, in spec.py's `PipelineSpec`, which is what a YAML
file or a Component is validated against.
"""

from __future__ import annotations

import re
import string
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, PrivateAttr, model_validator

from batch_assets.registries import (
    DIMENSION_KINDS,
    FILE_COLUMNS,
    PARTITION_KINDS,
    SAMPLE_DATASETS,
    SINK_FORMATS,
    SOURCE_FORMATS,
)
from batch_assets.spec_prepare import ColumnTransform, DocumentSpec, JoinSpec, TrialSpec
from batch_assets.tasks import TASKS
from batch_assets.resources.registry import PROVIDERS
from batch_assets.resources.structured import StructuredOutput

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
PARTITION_TOKEN = "{partition}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceSpec(_Strict):
    format: Literal[SOURCE_FORMATS] = Field(
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
    sample: Literal[SAMPLE_DATASETS] | None = Field(
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


class PartitionDimensionSpec(_Strict):
    """One dimension of `kind: multi` partitioning (two of them: a day or a set of keys, crossed with keys)."""

    name: str = Field(description="multi: the dimension's name, an identifier (e.g. date, app); {name} in "
                      "source.path is replaced by this dimension's key.")
    kind: Literal[DIMENSION_KINDS] = Field(
        description="multi: daily (one key per day, YYYY-MM-DD), static (the keys listed) or dynamic (keys added "
        "at run time: the UI, a sensor, `add_partitions`).")
    keys: list[str] | None = Field(default=None, description="multi, static dimension: its keys.")
    start_date: str | None = Field(default=None, description="multi, daily dimension: first day, YYYY-MM-DD.")
    end_date: str | None = Field(default=None, description="multi, daily dimension: day after the last one.")
    timezone: str = Field(default="UTC", description="multi, daily dimension: timezone of the day boundaries.")


class PartitioningSpec(_Strict):
    kind: Literal[PARTITION_KINDS] = Field(
        description="static, hash, daily, dynamic, or multi: two dimensions crossed (e.g. day x app), each "
        "partition key being the two dimension keys joined by '|' in the order of the dimension NAMES "
        "(app and date: 'android|2026-11-01'). See docs/concepts.md, 'Two-dimensional partitions'.")
    dimensions: list[PartitionDimensionSpec] | None = Field(
        default=None,
        description="multi: exactly two dimensions; at most one daily; static and dynamic keys must not hold "
        "'|', ',', '[' or ']'. source.path names each dimension as {<name>} (e.g. "
        "data/reviews/{date}/{app}.jsonl).",
    )

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
    kind: Literal[tuple(TASKS)]
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
    format: Literal[SINK_FORMATS] = Field(
        default="parquet",
        description="parquet / jsonl / csv: one file per partition. lancedb: one vector-store table, each row "
        "tagged with its partition_key; a re-materialized partition replaces its rows in one commit.",
    )
    columns: list[str] | None = Field(default=None, description="Columns to keep, in order (default: all).")
    table: str | None = Field(default=None, description="lancedb only (another format refuses it): the table name "
                               "(default: the pipeline name).")


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
        "(batch_assets/orchestration/execution/pool_slots.py).",
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


class PipelineSections(_Strict):
    """The whole spec's sections, checked one by one; spec.PipelineSpec adds the checks across them."""

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
