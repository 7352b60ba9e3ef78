"""A pipeline declared once: source, partitioning, preparation, task, model and sink.

A spec is a YAML file in batch_assets/pipelines/, or the attributes of a Dagster Component (`BatchInferencePipeline`,
batch_assets/components/pipeline.py, whose attribute model is this PipelineSpec); either way it is validated by
pydantic (typed, with field paths in every error) and turned into Dagster assets by orchestration/assets/factory.py. The
spec itself stays a plain pydantic model, readable outside a Dagster process (the demo driver, benchmarks, tests).

Three layers, imports running one way (tests/test_layout.py): the names a spec may choose (registries.py) at the
bottom; the typed sections, each checking only itself (spec_sections.py), which is all the stages, their plug-ins
(source and sink formats, partition kinds) and reliability/ read; then, above the stages, this module:
`PipelineSpec`, whose check crosses the sections (template columns against source columns, task against provider
capability) and asks each plug-in the spec names for its own rules (`spec_problems`), at definition load. Only what
loads a spec (the code location, Components, commands, tests) imports it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, model_validator

from batch_assets.spec_prepare import function_problem, join_output_problems
from batch_assets.spec_sections import (  # some only handed on: the rest of the package names them as the spec's
    NAME_RE,
    PARTITION_TOKEN,
    AutomationSpec,
    InferResources,
    PartitionDimensionSpec,
    PipelineSections,
    Toleration,
    parse_quantity,
)
from batch_assets.partitions import day_timezone, partition_kind, time_dimension
from batch_assets.stages.sinks import sink_for
from batch_assets.stages.sources import source_module
from batch_assets.storage import is_remote, resolve_local
from batch_assets.tasks import RESERVED_COLUMNS, TASKS
from batch_assets.resources.protocols import supports
from batch_assets.resources.registry import PROVIDERS, provider_class
from batch_assets.resources.secrets import literal_secret_problem, literal_secrets


class SpecError(ValueError):
    """A pipeline spec is invalid; raised at definition load, naming the pipeline, the file and the field."""


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


class PipelineSpec(PipelineSections):
    """A pipeline spec: its sections (spec_sections.py), checked against each other and by the plug-ins it names
    (task kind, partition kind, provider, source and sink format: each states its own rules), at load."""

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

        problems += partition_kind(self).spec_problems(self)  # what the partitioning kind needs (partitions.py)

        secret_literals = literal_secrets(self.model.config)
        if secret_literals:
            problems.append(("model.config", literal_secret_problem(secret_literals)))
        problems += _orchestration_problems(self)

        problems += source_module(self.source.format).spec_problems(self)  # stages/sources/<format>.py
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
    if spec.schedule is not None:
        if not partition_kind(spec).days and time_dimension(spec) is None:
            problems.append(("schedule", "a schedule materializes the newest complete day: it needs daily "
                             "partitioning, or multi partitioning with a daily dimension"))
        if not is_valid_cron_string(spec.schedule.cron):
            problems.append(("schedule.cron", f"{spec.schedule.cron!r} is not a cron string like '30 1 * * *'"))
        try:
            ZoneInfo(spec.schedule.timezone or day_timezone(spec))
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(("schedule.timezone", f"unknown timezone {spec.schedule.timezone!r}"))
    if spec.sensor is not None:
        problems += partition_kind(spec).sensor_problems(spec)
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
                ZoneInfo(auto.timezone or day_timezone(spec))
            except (ZoneInfoNotFoundError, ValueError):
                problems.append(("automation.timezone", f"unknown timezone {auto.timezone!r}"))
        elif auto.condition == "on_missing" and partition_kind(spec).no_new_keys(spec):
            problems.append(("automation.condition", "on_missing requests partitions that appear after it is "
                             "switched on, and this pipeline's partitions never change "
                             f"({partition_kind(spec).no_new_keys(spec)}): it would never launch anything. Use a "
                             "backfill for the partitions there are, or on_cron"))
        if auto.condition != "on_cron" and (auto.cron or auto.timezone):
            problems.append(("automation.cron", f"cron and timezone are for on_cron; {auto.condition} has no ticks"))
    return problems


ASSET_KEY_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-.]*$")


def _upstream_asset_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """source.asset: a key Dagster accepts, partitions that can map one to one, and one launcher. Whether the key
    exists and its partitions match are known only with the whole code location: orchestration/assets/upstream.py."""
    asset = spec.source.asset
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
    problems += partition_kind(spec).upstream_problems(spec, parts[-1])
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
