"""What each stage's partition was made from, so that no launch path pays twice for the same output.

After a stage commits a partition it leaves a small record beside the data,
`<storage root>/<pipeline>/_lineage/<stage>/<partition>.json`: the **source version** the partition was made from
(a digest of the partition's source files and their content versions, batch_assets/stages/sources/versions.py: a
file whose bytes did not change keeps its version whatever its mtime; the sensor keeps the same per-file versions
in its cursor, and the raw asset reports the digest as its data version) and the stage's **code version** (a digest
of every spec section the stage's output depends on, upstream stages' sections included:
batch_assets/orchestration/assets/factory.py `stage_code_version`).

Records written before versions were by content hold the old digest (mtime or ETag, and size: `legacy_version`).
A record that matches it, while the file is unchanged, is taken as made from today's content and rewritten with the
content version, every stage's at once, so upgrading re-runs (and pays for) nothing.

A stage whose record matches what it would make now (same source version, same code version, the file still
there) is skipped: the run records the partition as materialized with `skipped` metadata saying which run made it,
and nothing is read, inferred or written. The source version flows down: `raw` takes the current one before it
reads, every later stage takes the one its upstream stage recorded, so a file rewritten in the middle of a run is
seen as new by the next launch, never mixed up with the old one.

Every launch path goes through this: a schedule tick, a sensor run, a backfill (single or multi run), a UI or
`dg launch` run. The sensor and the schedule also ask `published()` before they request a run at all, so a day
that a backfill already published is adopted (no run) and a schedule and a sensor on one pipeline do not both
run a day. To run a stage again over unchanged input on purpose (a model whose answers you want afresh, a
repaired endpoint), launch the run with the tag `batch/rerun=force` (UI launchpad: Tags; docs/launch-paths.md).

Records live in the storage, not in the Dagster instance, so they hold across launch paths, deployments and a
lost instance, and a record is written inside the stage's partition lock (batch_assets/reliability/locks.py): a second run of
the same partition waiting at the lock sees the first one's record and skips.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from batch_assets.errors import PipelineError
from batch_assets.partition_files import shard_of
from batch_assets.partitions import hash_shard_keys, partition_kind, partitions_def_for, resolve_partition
from batch_assets.reliability.row_ids import stable_hash64
from batch_assets.spec import PipelineSpec, written_path
from batch_assets.stage_names import ASSET_NAMES, INFER, PREPARE, READ, WRITE, upstream_of
from batch_assets.stages.sources.files import file_infos, file_row_ids
from batch_assets.stages.sources.versions import content_version
from batch_assets.storage import ArrowStorage, atomic_output, exists, filesystem_for, join, partition_file_name
from batch_assets.resources.custom.loading import import_object

# What each stage's output depends on in the spec, its own sections and every upstream stage's: a changed prompt
# makes `prepared`, `inferred` and `output` stale (Dagster marks an asset stale for its own code version only, so
# the sections are cumulative); a changed model or max_new_tokens makes `inferred` and `output` stale. Knobs that
# change how fast, not what (batch_rows, chunk_rows, retries, schedules, sensors), are left out.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    READ.asset: ("source", "partitioning"),
    PREPARE.asset: ("source", "partitioning", "prepare"),
    INFER.asset: ("source", "partitioning", "prepare", "task", "model"),
    WRITE.asset: ("source", "partitioning", "prepare", "task", "model", "sink"),
}
# Also left out: source.asset and partition_mapping say which Dagster asset writes the files, not what is read
# (source.path is); with them in the digest, adding the fields would have made every existing pipeline stale.
SPEED_ONLY_FIELDS = {"source": {"batch_rows", "asset", "partition_mapping"}}
# Fields a section gained after pipelines were first published: left out of the digest while they hold their
# default, so a new field never makes every published partition stale and paid for again on upgrade; a spec that
# sets one gets a new version, as any edit does. tests/orchestration/assets/test_code_versions.py keeps the shipped
# pipelines' versions from before these fields existed.
# A dotted name reaches into a subsection (task.structured).
ADDED_FIELDS: dict[str, dict[str, Any]] = {"partitioning": {"dimensions": None},
                                           "prepare": {"documents": {}, "file_columns": []},
                                           "task": {"structured.allow_extra_keys": False},
                                           # batch prices (issue 25): cost metadata only, None = half the online price
                                           "model": {"pricing.batch_input_per_million_tokens": None,
                                                     "pricing.batch_output_per_million_tokens": None}}
RERUN_TAG = "batch/rerun"
FORCE = "force"


def stage_code_version(spec: PipelineSpec, stage: str) -> str:
    """A digest of the spec sections a stage's output depends on (STAGE_SECTIONS): edit the prompt, model or
    params and that stage and every stage after it show as stale in the UI ("has a new code version"), and their
    lineage records no longer match, so the next run redoes them. {env: NAME} secrets enter by name only."""
    dumped = spec.model_dump(mode="json")
    for section in ("source", "sink"):  # as written: a relative path stays relative wherever the project lives
        dumped[section]["path"] = written_path(spec, section)
    sections = {
        name: {k: v for k, v in dumped[name].items() if k not in SPEED_ONLY_FIELDS.get(name, set())}
        for name in STAGE_SECTIONS[stage]
    }
    for name, added in ADDED_FIELDS.items():
        for dotted, default in added.items():
            *parents, field = dotted.split(".")
            holder = sections.get(name)
            for part in parents:
                holder = holder.get(part) if isinstance(holder, dict) else None
            if isinstance(holder, dict) and field in holder and holder[field] == default:
                del holder[field]
    if spec.prepare.function and "prepare" in sections:
        sections["prepare_function_source"] = function_source_digest(spec.prepare.function)
    digest = hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode("utf-8")).hexdigest()
    return f"{stage}-{digest[:12]}"


def function_source_digest(path: str) -> str:
    """A digest of the source file of `prepare.function`'s module: an edited function makes `prepared` and every
    later stage stale, as an edited spec does (a module without a readable source: its import path alone)."""
    module = sys.modules.get(path.partition(":")[0])
    if module is None:
        import_object(path, "prepare.function")
        module = sys.modules.get(path.partition(":")[0])
    try:
        source = inspect.getsource(module) if module is not None else path
    except (OSError, TypeError):
        source = path
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def file_modified(info: dict[str, Any]) -> float:
    for name in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def file_version(info: dict[str, Any]) -> str:
    """The version records and sensor cursors held before versions were by content: ETag (S3) or mtime, and size.
    Only to recognise those (legacy_source_version); a file's version is `content_version`."""
    etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
    basis = f"{etag}|{info.get('size')}" if etag else f"{file_modified(info)!r}|{info.get('size')}"
    return hashlib.blake2b(basis.encode("utf-8"), digest_size=8).hexdigest()


def source_version(spec: PipelineSpec, key: str, storage: ArrowStorage | None = None) -> str | None:
    """The digest of the partition's source files and their content versions now (a local file is hashed only
    when its stat changed; S3 answers from the ETag or checksum: batch_assets/stages/sources/versions.py); None
    when they cannot be listed (the read stage then fails with the reason). `storage`: whose root keeps the cache
    of local digests."""
    root = (storage or ArrowStorage()).resolved_root()
    try:
        files = own_files(spec, key, resolve_partition(spec, key).files)
        # one listing per folder of many files, not a HEAD per object (a files source of 10,000 objects)
        infos = {url: info for url, info in file_infos(files).items() if isinstance(info, dict)}
        parts = [f"{url}={_version_of(spec, url, infos.get(url), root)}" for url in sorted(files)]
    except (PipelineError, OSError):
        return None
    return "c-" + hashlib.blake2b("\n".join(parts).encode("utf-8"), digest_size=12).hexdigest()


def _version_of(spec: PipelineSpec, url: str, info: dict[str, Any] | None, root: str) -> str:
    """A file's content version. A files source reads a file it cannot open as that row's error and publishes the
    rest, so such a file has a version too (what kept it unread): without one the partition would have none, and
    every run would make it, and pay for every file in it, again. A table's unreadable file fails the read: raised."""
    try:
        return content_version(url, info, cache_root=root)
    except OSError as exc:
        if spec.source.format != "files":
            raise
        return f"unreadable:{type(exc).__name__}"


def versions_per_key(spec: PipelineSpec) -> bool:
    """Whether each hash shard's source version covers only its own files (`own_files`), not the whole source."""
    return (spec.source.format == "files" and partition_kind(spec).reads_whole_source
            and spec.prepare.id_column in (None, "file_path"))


def own_files(spec: PipelineSpec, key: str, files: list[str]) -> list[str]:
    """The files a partition's source version covers. A files source is one row per file, so its hash shard holds
    the files whose row id hashes to it: its version covers those alone, and a new or rewritten file makes its own
    shard run (and pay) again, not every shard. A table's rows can hash to any shard from any file: every shard
    covers every file. (With prepare.id_column naming file_version or file_size, the id is not known before the
    file is read: every file.)"""
    if not versions_per_key(spec):
        return files
    count = spec.partitioning.count or 1
    ids = file_row_ids(spec, files) if spec.prepare.id_column is None else list(files)
    mine = shard_of(stable_hash64(ids), count) == np.uint64(hash_shard_keys(count).index(key))
    return [url for url, keep in zip(files, mine.tolist()) if keep]


def legacy_source_version(spec: PipelineSpec, key: str) -> str | None:
    """The digest records held before versions were by content (file mtime or ETag, and size): only to recognise
    a record made from the files as they still are (module docstring)."""
    try:
        files = resolve_partition(spec, key).files
    except (PipelineError, OSError):
        return None
    parts = []
    infos = file_infos(files)  # one listing per folder of many files, as source_version
    for url in sorted(files):
        info = infos.get(url)
        if not isinstance(info, dict):
            return None
        parts.append(f"{url}={file_version(info)}")
    return hashlib.blake2b("\n".join(parts).encode("utf-8"), digest_size=12).hexdigest()


def record_url(storage: ArrowStorage, pipeline: str, stage: str, key: str) -> str:
    return join(storage.resolved_root(), pipeline, "_lineage", stage, partition_file_name(key, "json"))


def read_record(storage: ArrowStorage, pipeline: str, stage: str, key: str) -> dict[str, Any] | None:
    fs, path = filesystem_for(record_url(storage, pipeline, stage, key))
    try:
        with fs.open(path, "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return None


def forget(storage: ArrowStorage, pipeline: str, stage: str, key: str) -> None:
    """Drop a stage's record before the stage rewrites its partition: a crash mid-way leaves no stale record."""
    fs, path = filesystem_for(record_url(storage, pipeline, stage, key))
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass


def write_record(storage: ArrowStorage, pipeline: str, stage: str, key: str, record: dict[str, Any]) -> None:
    fs, path = filesystem_for(record_url(storage, pipeline, stage, key))
    with atomic_output(fs, path) as f:
        f.write(json.dumps(record, sort_keys=True).encode("utf-8"))


@dataclass(frozen=True)
class Inputs:
    """What a stage's partition would be made from now. `legacy_version`: the same files' digest as records
    held it before versions were by content, to recognise such a record (module docstring)."""

    source_version: str | None
    code_version: str
    legacy_version: str | None = None


def inputs_for(spec: PipelineSpec, storage: ArrowStorage, stage: str, key: str, code_version: str) -> Inputs:
    before = upstream_of(stage)
    if before is None:
        return Inputs(source_version(spec, key, storage), code_version, legacy_source_version(spec, key))
    upstream = read_record(storage, spec.name, before.asset, key)
    return Inputs(upstream.get("source_version") if upstream else None, code_version)


def matching(storage: ArrowStorage, pipeline: str, stage: str, key: str, inputs: Inputs) -> dict[str, Any] | None:
    """The stage's record when its partition was made from exactly these inputs and is still there."""
    if inputs.source_version is None:
        return None
    record = read_record(storage, pipeline, stage, key)
    if not record or record.get("code_version") != inputs.code_version:
        return None
    legacy = inputs.legacy_version is not None and record.get("source_version") == inputs.legacy_version
    if record.get("source_version") != inputs.source_version and not legacy:
        return None
    path = record.get("path")
    if not path or not exists(path):
        return None
    if legacy:
        _adopt_content_version(storage, pipeline, key, inputs.legacy_version, inputs.source_version)
        record = {**record, "source_version": inputs.source_version}
    return record


def _adopt_content_version(storage: ArrowStorage, pipeline: str, key: str, legacy: str | None, content: str | None
                           ) -> None:
    """Every stage's record of the partition made from `legacy` (the files as they still are) now says
    `content`: later stages, which compare with their upstream stage's record, keep matching."""
    for stage in ASSET_NAMES:
        record = read_record(storage, pipeline, stage, key)
        if record is not None and record.get("source_version") == legacy:
            write_record(storage, pipeline, stage, key, {**record, "source_version": content})


_UNSET: Any = object()


def published(spec: PipelineSpec, storage: ArrowStorage, key: str, version: str | None = _UNSET
              ) -> dict[str, Any] | None:
    """The output's record when the partition's published output already matches its current source and spec
    (what a sensor or schedule asks before requesting a run); else None. `version`: the source version, when the
    caller has it already."""
    version = source_version(spec, key, storage) if version is _UNSET else version
    inputs = Inputs(version, stage_code_version(spec, WRITE.asset), legacy_source_version(spec, key))
    return matching(storage, spec.name, WRITE.asset, key, inputs)


def new_record(inputs: Inputs, run_id: str, path: str, rows: int, extra: dict[str, Any]) -> dict[str, Any]:
    plain = {k: v for k, v in extra.items() if isinstance(v, (int, float, str, bool))}
    return {"source_version": inputs.source_version, "code_version": inputs.code_version, "run_id": run_id,
            "path": path, "rows": rows, "written_at": time.time(), "extra": plain}


def describe(record: dict[str, Any]) -> str:
    when = datetime.fromtimestamp(record.get("written_at", 0)).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    return f"run {record.get('run_id', '?')[:8]} at {when}"


IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")


def runs_in_flight(instance: Any, spec: PipelineSpec, job: str) -> dict[str, Any]:
    """{partition key: run} for every run of the pipeline that is queued or running, whoever launched it (its
    job, a UI or CLI asset selection, a single-run backfill over a range), so a schedule or sensor never requests
    a partition that another launch path is already making."""
    import dagster as dg

    statuses = [getattr(dg.DagsterRunStatus, s) for s in IN_FLIGHT]
    pdef = partitions_def_for(spec)
    found: dict[str, Any] = {}
    for run in instance.get_runs(dg.RunsFilter(statuses=statuses), limit=500):
        selected = run.asset_selection or set()
        if run.job_name != job and not any(k.path[0] == spec.name for k in selected):
            continue
        tags = run.tags
        if "dagster/partition" in tags:
            found.setdefault(tags["dagster/partition"], run)
        elif "dagster/asset_partition_range_start" in tags:
            with dg.partition_loading_context(dynamic_partitions_store=instance):
                keys = pdef.get_partition_keys_in_range(dg.PartitionKeyRange(
                    tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]))
            for key in keys:
                found.setdefault(key, run)
    return found


def launched_by(run: Any) -> str:
    who = run.tags.get("batch/launched_by") or ("a backfill" if run.tags.get("dagster/backfill") else "a user")
    return f"run {run.run_id[:8]} ({who}, {run.status.value.lower()})"
