"""Partitioning: which Dagster partitions a pipeline has, and which source rows each one reads.

- static: explicit keys substituted for {partition} in the source path, or one key per file found at load;
- hash: N shards over every source row, by the row id's stable hash (reliability/row_ids.py);
- daily: one partition per day, from a per-day file ({partition} = YYYY-MM-DD) or a timestamp column;
- dynamic: keys added at run time (UI, sensor, `add_partitions`), each substituted for {partition}.
- multi: two dimensions crossed (Dagster's MultiPartitionsDefinition: a day or static keys x static or dynamic
  keys). A key is the dimension keys joined by '|' in the order of the dimension names (app, date:
  'android|2026-11-01'); each dimension's key is substituted for {<name>} in the source path, the whole key for
  {partition}. Everywhere else (storage paths, checkpoints, locks, lineage, dead letters) the whole key is the
  partition key, quoted for paths like any other key (storage.partition_file_name).

One class per kind (`StaticKind`, `HashKind`, `DailyKind`, `DynamicKind`, `MultiKind`), in one table, `KINDS`, like
the task table: the only place that compares partitioning kinds (tests/test_partition_kinds.py fails on a `kind ==`
anywhere else). A kind answers what the spec alone tells (its own checks, which spec.PipelineSpec asks at load; what
a sensor, a schedule, an upstream asset or automation can do with it) and what a run needs (Dagster's partitions
definition, the files and rows of one partition, with the listing and row filters of partition_files.py). A new
kind is one class, one table entry and its name in registries.PARTITION_KINDS.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, ClassVar

import dagster as dg

from batch_assets.errors import PipelineError, Problems
from batch_assets.partition_files import (
    PartitionSlice,
    day_check,
    day_filter,
    discover_file_keys,
    expand,
    file_key,
    hash_filter,
    hash_shard_keys,
    require_files,
)
from batch_assets.spec_sections import PARTITION_TOKEN, PartitionDimensionSpec, PartitioningSpec, PipelineSections
from batch_assets.storage import shown_path
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Dagster joins a multi-partition key's dimension keys with '|' and lists keys with ',' and '[...]' (dagster's
# INVALID_STATIC_PARTITIONS_KEY_CHARACTERS): a key holding one would be split wrongly, or silently dropped.
MULTI_KEY_FORBIDDEN = ("|", ",", "[", "]")


class PartitionKind:
    """One partitioning kind (`partitioning.kind`, or a `multi` dimension's kind): the one place that decides which
    partitions a pipeline has, which files and rows each reads, how a new file maps to one, and what the kind needs
    from the rest of the spec. Class methods only: a kind is a rule over the spec, with no state of its own.
    Subclasses set the class attributes and override what differs."""

    kind: ClassVar[str]
    dimension: ClassVar[bool] = False  # may be one dimension of `kind: multi` (registries.DIMENSION_KINDS)
    days: ClassVar[bool] = False  # the keys are days, YYYY-MM-DD (a schedule ticks over them)
    # Every partition reads every source file and keeps its share of the rows: the partitions of one run share one
    # read, and what a partition holds is known only from its rows' ids.
    reads_whole_source: ClassVar[bool] = False
    added_at_run_time: ClassVar[bool] = False  # the keys are added at run time (the UI, a sensor, add_partitions)

    # -- from the spec alone -----------------------------------------------------------------------------------------
    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        """What this kind needs from the spec (partitioning's own fields, source.path); the generic column checks
        stay in spec.PipelineSpec."""
        part = spec.partitioning
        if part.dimensions is not None:
            return [("partitioning.dimensions", f"dimensions are for kind: multi, not {part.kind!r}")]
        return []

    @classmethod
    def time_dimension(cls, spec: PipelineSections) -> PartitionDimensionSpec | None:
        """multi: the daily dimension, if there is one (a schedule ticks over it)."""
        return None

    @classmethod
    def no_new_keys(cls, spec: PipelineSections) -> str | None:
        """Why this pipeline's partitions never change (automation's on_missing would never launch), or None."""
        return None

    @classmethod
    def shards(cls, spec: PipelineSections) -> int:
        """How many partitions split the same source rows between them (a partition's size is 1/shards of its
        files'): 1 unless every partition reads the whole source."""
        return 1

    @classmethod
    def placeholders(cls, spec: PipelineSections) -> list[str]:
        """The names in source.path a file's path gives a key for: {partition}, or each dimension's {<name>}."""
        return [PARTITION_TOKEN.strip("{}")]

    @classmethod
    def key_of(cls, spec: PipelineSections, values: dict[str, str]) -> str:
        """The partition key of a file whose path gave `values` for `placeholders(spec)`."""
        return values[PARTITION_TOKEN.strip("{}")]

    @classmethod
    def reads_own_files(cls, spec: PipelineSections) -> bool:
        """Each partition reads files of its own, named through source.path's placeholders (a sensor and an
        upstream asset map a file to a partition that way)."""
        return PARTITION_TOKEN in spec.source.path

    @classmethod
    def sensor_problems(cls, spec: PipelineSections) -> Problems:
        if cls.reads_own_files(spec):
            return []
        return [("sensor", f"a sensor maps each new file to a partition through {PARTITION_TOKEN} in source.path; "
                 "this pipeline has no per-file partitions")]

    @classmethod
    def upstream_problems(cls, spec: PipelineSections, asset_name: str) -> Problems:
        """source.asset: this kind's partitions mapped one to one onto the upstream asset's (identity)."""
        if cls.reads_own_files(spec):
            return []
        return [("source.path", f"with source.asset, the path says where the upstream asset writes each partition: "
                 f"put {PARTITION_TOKEN} in it (e.g. data/{asset_name}/{PARTITION_TOKEN}.jsonl; two-dimensional "
                 "partitions: each {<dimension>})")]

    @classmethod
    def dimension_problems(cls, dim: PartitionDimensionSpec, where: str) -> Problems:
        """multi: what this kind needs of one dimension."""
        problems: Problems = []
        if dim.start_date or dim.end_date:
            problems.append((f"{where}.start_date", f"start_date / end_date are for a daily dimension, not {dim.kind}"))
        if dim.keys is not None:
            problems.append((f"{where}.keys", f"keys are listed for a static dimension; a {dim.kind} dimension's "
                             "keys " + ("are days" if cls.days else "are added at run time" if cls.added_at_run_time
                                        else "are not listed")))
        return problems

    @classmethod
    def dimension_key_problem(cls, dim: PartitionDimensionSpec, key: str) -> str | None:
        """multi: why `key` is not a key of this dimension, when that is known from the spec (else None)."""
        return None

    # -- Dagster's partitions and the rows of one ----------------------------------------------------------------------
    @classmethod
    def definition(cls, part: PartitioningSpec | PartitionDimensionSpec, dynamic_name: str) -> dg.PartitionsDefinition:
        """Dagster's partitions of a partitioning, or of one multi dimension (their fields are the same)."""
        raise NotImplementedError(f"{cls.kind} partitioning has no partitions of its own fields")

    @classmethod
    def partitions_def(cls, spec: PipelineSections) -> dg.PartitionsDefinition:
        return cls.definition(spec.partitioning, spec.name)

    @classmethod
    def dimension_keys(cls, spec: PipelineSections, key: str) -> dict[str, str]:
        """A key's key in each dimension, by dimension name ({}: one dimension)."""
        return {}

    @classmethod
    def id_prefix(cls, spec: PipelineSections, url: str) -> str:
        """The file part of a default row id ('<file>:<row>'): the file's name."""
        return url.rstrip("/").split("/")[-1]

    @classmethod
    def resolve(cls, spec: PipelineSections, key: str) -> PartitionSlice:
        """The files partition `key` reads and, where it keeps only some of their rows, which."""
        pattern = spec.source.path
        concrete = pattern.replace(PARTITION_TOKEN, key) if PARTITION_TOKEN in pattern else pattern
        return PartitionSlice(key, require_files(expand(concrete), spec, key, concrete))


class StaticKind(PartitionKind):
    """Keys listed in the spec, each substituted for {partition}; or one key per file found at load."""

    kind = "static"
    dimension = True

    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        problems = super().spec_problems(spec)
        if spec.partitioning.keys and PARTITION_TOKEN not in spec.source.path:
            problems.append(("source.path", f"static keys are substituted for {PARTITION_TOKEN}: add it to the path"))
        return problems

    @classmethod
    def no_new_keys(cls, spec: PipelineSections) -> str | None:
        return "static keys listed in the spec" if spec.partitioning.keys else None

    @classmethod
    def dimension_problems(cls, dim: PartitionDimensionSpec, where: str) -> Problems:
        problems: Problems = []
        if dim.start_date or dim.end_date:
            problems.append((f"{where}.start_date", f"start_date / end_date are for a daily dimension, not {dim.kind}"))
        if not dim.keys:
            problems.append((f"{where}.keys", "a static dimension lists its keys"))
        return problems

    @classmethod
    def dimension_key_problem(cls, dim: PartitionDimensionSpec, key: str) -> str | None:
        return None if key in (dim.keys or []) else f"{key!r} is not a key of dimension {dim.name!r} " \
            f"({', '.join(dim.keys or [])})"

    @classmethod
    def definition(cls, part: PartitioningSpec | PartitionDimensionSpec, dynamic_name: str) -> dg.PartitionsDefinition:
        return dg.StaticPartitionsDefinition(list(part.keys or []))

    @classmethod
    def partitions_def(cls, spec: PipelineSections) -> dg.PartitionsDefinition:
        keys = spec.partitioning.keys or discover_file_keys(spec)
        if not keys:
            raise PipelineError(
                "no partition keys: no file matches source.path and partitioning.keys is not set",
                pipeline=spec.name,
                file=shown_path(spec.source.path),
                fix="add files, or list partitioning.keys",
            )
        return dg.StaticPartitionsDefinition(keys)

    @classmethod
    def resolve(cls, spec: PipelineSections, key: str) -> PartitionSlice:
        pattern = spec.source.path
        if PARTITION_TOKEN in pattern or spec.partitioning.keys:
            return super().resolve(spec, key)
        # one partition per file found at load: pick that file again
        concrete = next((u for u in expand(pattern) if file_key(u) == key), pattern + f" (key {key})")
        return PartitionSlice(key, require_files(expand(concrete), spec, key, concrete))


class HashKind(PartitionKind):
    """N shards over every source row, by a stable hash of the row id (reliability/row_ids.py)."""

    kind = "hash"
    reads_whole_source = True

    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        problems = super().spec_problems(spec)
        if not spec.partitioning.count:
            problems.append(("partitioning.count", "hash partitioning needs count (number of shards)"))
        if PARTITION_TOKEN in spec.source.path:
            problems.append(("source.path", "hash shards read every file: remove {partition} from the path"))
        return problems

    @classmethod
    def shards(cls, spec: PipelineSections) -> int:
        return spec.partitioning.count or 1

    @classmethod
    def no_new_keys(cls, spec: PipelineSections) -> str | None:
        return "hash shards"

    @classmethod
    def reads_own_files(cls, spec: PipelineSections) -> bool:
        return False  # every shard reads every file

    @classmethod
    def upstream_problems(cls, spec: PipelineSections, asset_name: str) -> Problems:
        return [("source.asset", "hash shards have no upstream partition to map to: partition the pipeline as the "
                 "upstream asset is (daily, static or dynamic), or drop source.asset")]

    @classmethod
    def partitions_def(cls, spec: PipelineSections) -> dg.PartitionsDefinition:
        return dg.StaticPartitionsDefinition(hash_shard_keys(cls.shards(spec)))

    @classmethod
    def resolve(cls, spec: PipelineSections, key: str) -> PartitionSlice:
        count = cls.shards(spec)
        files = expand(spec.source.path)
        filter_ = hash_filter(hash_shard_keys(count).index(key), count)
        return PartitionSlice(key, require_files(files, spec, key, spec.source.path), filter_)


class DailyKind(PartitionKind):
    """One partition per day: a per-day file ({partition} = YYYY-MM-DD), or the rows of every file whose
    time_column falls in the day."""

    kind = "daily"
    dimension = True
    days = True

    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        part, problems = spec.partitioning, super().spec_problems(spec)
        if not part.start_date:
            problems.append(("partitioning.start_date", "daily partitioning needs start_date (YYYY-MM-DD)"))
        if not part.time_column and PARTITION_TOKEN not in spec.source.path:
            problems.append(("source.path", f"daily partitioning needs {PARTITION_TOKEN} in the path"))
        if part.time_column and spec.runtime.resources.by_size:
            problems.append(("runtime.resources.by_size", "a day filtered from a time column has no size of its "
                             "own in the source metadata: use partitions overrides instead"))
        return problems

    @classmethod
    def sensor_problems(cls, spec: PipelineSections) -> Problems:
        if spec.partitioning.time_column and PARTITION_TOKEN not in spec.source.path:
            return [("sensor", f"a sensor maps each new file to a partition through {PARTITION_TOKEN} in "
                     "source.path, and here a day is made of rows of any file (time_column): a new file "
                     "can change any day. Use `schedule:` instead (the newest complete day, once it has "
                     "ended), or write one file per day and put {partition} in source.path (time_column "
                     "then checks each row's day, see partitioning.day_check)")]
        return super().sensor_problems(spec)

    @classmethod
    def dimension_problems(cls, dim: PartitionDimensionSpec, where: str) -> Problems:
        problems: Problems = []
        if not dim.start_date:
            problems.append((f"{where}.start_date", "a daily dimension needs start_date (YYYY-MM-DD)"))
        if dim.keys is not None:
            problems.append((f"{where}.keys", f"keys are listed for a static dimension; a {dim.kind} dimension's "
                             "keys are days"))
        return problems

    @classmethod
    def dimension_key_problem(cls, dim: PartitionDimensionSpec, key: str) -> str | None:
        try:
            datetime.strptime(key, "%Y-%m-%d")
        except ValueError:
            return f"{key!r} is not a day (YYYY-MM-DD) of dimension {dim.name!r}"
        return None

    @classmethod
    def definition(cls, part: PartitioningSpec | PartitionDimensionSpec, dynamic_name: str) -> dg.PartitionsDefinition:
        return dg.DailyPartitionsDefinition(start_date=part.start_date, end_date=part.end_date, timezone=part.timezone)

    @classmethod
    def resolve(cls, spec: PipelineSections, key: str) -> PartitionSlice:
        part, pattern = spec.partitioning, spec.source.path
        if not part.time_column:
            return super().resolve(spec, key)
        if PARTITION_TOKEN in pattern:
            concrete = pattern.replace(PARTITION_TOKEN, key)  # one file per day: check its rows are of that day
            files = require_files(expand(concrete), spec, key, concrete)
            check = day_check(key, part.time_column, part.timezone) if part.day_check == "fail" else None
            return PartitionSlice(key, files, check)
        files = require_files(expand(pattern), spec, key, pattern)
        return PartitionSlice(key, files, day_filter(key, part.time_column, part.timezone))


class DynamicKind(PartitionKind):
    """Keys added at run time (the UI, a sensor, `add_partitions`), each substituted for {partition}."""

    kind = "dynamic"
    dimension = True
    added_at_run_time = True

    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        problems = super().spec_problems(spec)
        if PARTITION_TOKEN not in spec.source.path:
            problems.append(("source.path", f"dynamic partitioning needs {PARTITION_TOKEN} in the path"))
        return problems

    @classmethod
    def definition(cls, part: PartitioningSpec | PartitionDimensionSpec, dynamic_name: str) -> dg.PartitionsDefinition:
        return dg.DynamicPartitionsDefinition(name=dynamic_name)


class MultiKind(PartitionKind):
    """Two dimensions crossed (Dagster's MultiPartitionsDefinition); each partition reads its own files, named by
    each dimension's {<name>} in source.path."""

    kind = "multi"

    @classmethod
    def spec_problems(cls, spec: PipelineSections) -> Problems:
        """Two dimensions Dagster's MultiPartitionsDefinition accepts, each reachable from source.path. Checked
        here, at load, because Dagster's own errors come later (at a run) or never: a dynamic key with '|' is
        silently left out of the partitions."""
        part = spec.partitioning
        problems: Problems = []
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
                problems.append((f"{where}.name", f"{dim.name!r} must be an identifier (letters, digits, _) other "
                                 "than 'partition': it is the {" + dim.name + "} placeholder of source.path"))
            problems += KINDS[dim.kind].dimension_problems(dim, where)
            for key in dim.keys or []:
                bad = [c for c in MULTI_KEY_FORBIDDEN if c in key]
                if bad or not key:
                    problems.append((f"{where}.keys", f"key {key!r} " + (f"holds {' '.join(bad)}, which Dagster uses "
                                     "to join and list multi-partition keys: rename it" if bad else "is empty")))
            if dim.keys and len(set(dim.keys)) != len(dim.keys):
                problems.append((f"{where}.keys", "a key is listed twice"))
        if names[0] == names[1]:
            problems.append(("partitioning.dimensions", f"the two dimensions are both named {names[0]!r}"))
        if sum(KINDS[d.kind].days for d in dims) > 1:
            problems.append(("partitioning.dimensions", "at most one daily dimension: a day crossed with a day is "
                             "not a key of its own; cross the day with a static or dynamic dimension"))
        if sum(KINDS[d.kind].added_at_run_time for d in dims) > 1:
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
            problems.append(("source.sample", "sample data is not generated for multi partitioning: point "
                             "source.path at your files"))
        return problems + cls._override_problems(dims, spec.runtime.resources.partitions)

    @classmethod
    def _override_problems(cls, dims: list[PartitionDimensionSpec], overrides: dict[str, Any]) -> Problems:
        """`runtime.resources.partitions` keys of a multi pipeline: a key in the spec's dimension order (or with a
        part no dimension has) would never match, and the step would run on the default resources without a
        word."""
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
                problem = None if any(c in part for c in "*?[") else KINDS[dim.kind].dimension_key_problem(dim, part)
                if problem:
                    problems.append(("runtime.resources.partitions", f"{pattern!r}: {problem}; keys are {shape}"))
        return problems

    @classmethod
    def time_dimension(cls, spec: PipelineSections) -> PartitionDimensionSpec | None:
        return next((d for d in spec.partitioning.dimensions or [] if KINDS[d.kind].days), None)

    @classmethod
    def placeholders(cls, spec: PipelineSections) -> list[str]:
        return [d.name for d in spec.partitioning.dimensions or []]

    @classmethod
    def key_of(cls, spec: PipelineSections, values: dict[str, str]) -> str:
        return str(dg.MultiPartitionKey({name: values[name] for name in cls.placeholders(spec)}))

    @classmethod
    def reads_own_files(cls, spec: PipelineSections) -> bool:
        used = set(PLACEHOLDER_RE.findall(spec.source.path))
        return PARTITION_TOKEN.strip("{}") in used or set(cls.placeholders(spec)) <= used

    @classmethod
    def sensor_problems(cls, spec: PipelineSections) -> Problems:
        missing = [n for n in cls.placeholders(spec) if "{" + n + "}" not in spec.source.path]
        if not missing:
            return []
        return [("sensor", "a sensor maps each new file to a partition through each dimension's placeholder in "
                 "source.path; put " + " and ".join("{" + m + "}" for m in missing) + " in it (e.g. "
                 "data/reviews/{date}/{app}.jsonl)")]

    @classmethod
    def partitions_def(cls, spec: PipelineSections) -> dg.PartitionsDefinition:
        return dg.MultiPartitionsDefinition({
            d.name: KINDS[d.kind].definition(d, dynamic_dimension_name(spec, d.name))
            for d in spec.partitioning.dimensions or []})

    @classmethod
    def dimension_keys(cls, spec: PipelineSections, key: str) -> dict[str, str]:
        names = sorted(cls.placeholders(spec))  # Dagster orders a key's parts by dimension name
        parts = str(key).split("|")
        if len(parts) != len(names):
            raise PipelineError(
                f"partition key {key!r} is not a key of two dimensions: multi partition keys are the dimension "
                f"keys joined by '|' in the order of the dimension names ({'|'.join('<' + n + '>' for n in names)})",
                pipeline=spec.name, partition=str(key),
                fix=f"launch e.g. --partition \"{'|'.join('<' + n + '>' for n in names)}\"",
            )
        return dict(zip(names, parts))

    @classmethod
    def id_prefix(cls, spec: PipelineSections, url: str) -> str:
        """Multi partitioning names a partition's files by folders as well (data/reviews/{date}/{app}.jsonl): every
        day has an `android.jsonl`, so the id keeps the path from the first placeholder on
        (`2026-11-01/android.jsonl:3`), unique across partitions as a daily file's name is."""
        parts = url.rstrip("/").split("/")
        segments = spec.source.path.rstrip("/").split("/")
        first = next((i for i, seg in enumerate(segments) if "{" in seg), len(segments) - 1)
        return "/".join(parts[-(len(segments) - first):])

    @classmethod
    def resolve(cls, spec: PipelineSections, key: str) -> PartitionSlice:
        concrete = source_path_for(spec, key)  # each partition reads its own files (spec_problems)
        return PartitionSlice(key, require_files(expand(concrete), spec, key, concrete))


# The table: the one place a partitioning kind is looked up (tests/test_partition_kinds.py keeps it equal to
# registries.PARTITION_KINDS, which the spec's schema chooses from, and nothing else compares kinds).
KINDS: dict[str, type[PartitionKind]] = {kind.kind: kind for kind in (StaticKind, HashKind, DailyKind, DynamicKind,
                                                                      MultiKind)}


def partition_kind(spec: PipelineSections) -> type[PartitionKind]:
    """The class of the spec's partitioning kind."""
    return KINDS[spec.partitioning.kind]


def time_dimension(spec: PipelineSections) -> PartitionDimensionSpec | None:
    """multi: the daily dimension, if there is one (a schedule ticks over it); None for any other partitioning."""
    return partition_kind(spec).time_dimension(spec)


def day_timezone(spec: PipelineSections) -> str:
    """The timezone of the day boundaries: daily's, or a multi partitioning's daily dimension's."""
    dim = time_dimension(spec)
    return dim.timezone if dim is not None else spec.partitioning.timezone


def partitions_def_for(spec: PipelineSections) -> dg.PartitionsDefinition:
    return partition_kind(spec).partitions_def(spec)


def dynamic_dimension_name(spec: PipelineSections, dimension: str) -> str:
    """The instance-wide name of a multi pipeline's dynamic dimension (dynamic keys live in the instance)."""
    return f"{spec.name}__{dimension}"


def dimension_keys(spec: PipelineSections, key: str) -> dict[str, str]:
    """A multi partition key's key in each dimension, by dimension name ({} for any other partitioning)."""
    return partition_kind(spec).dimension_keys(spec, key)


def multi_key(spec: PipelineSections, by_dimension: dict[str, str]) -> str:
    """The multi partition key (as Dagster spells it) of one key per dimension."""
    return str(dg.MultiPartitionKey(by_dimension))


def default_id_prefix(spec: PipelineSections, url: str) -> str:
    """The file part of a default row id ('<file>:<row>'), as the partitioning kind names files."""
    return partition_kind(spec).id_prefix(spec, url)


def source_path_for(spec: PipelineSections, key: str) -> str:
    """source.path for one partition: {partition} is the whole key, and for multi partitioning {<dimension>} is
    that dimension's key (the placeholders of the agreed source interface)."""
    path = spec.source.path.replace(PARTITION_TOKEN, str(key))
    for name, value in dimension_keys(spec, key).items():
        path = path.replace("{" + name + "}", value)
    return path


def resolve_partition(spec: PipelineSections, key: str) -> PartitionSlice:
    return partition_kind(spec).resolve(spec, key)
