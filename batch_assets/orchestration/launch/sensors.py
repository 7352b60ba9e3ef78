"""Sensors on new input: each new (or rewritten) source file becomes a partition and one run.

The sensor lists `source.path` with `{partition}` as the wildcard (local folder or s3://, through fsspec) and maps
each file to the partition key that `{partition}` matches, so the run reads exactly that file. With multi
partitioning each dimension's placeholder is a wildcard (`data/reviews/{date}/{app}.jsonl`): a file's key is its
date and app joined as Dagster spells multi keys (`android|2026-11-02`), and a new key of a dynamic dimension is
added to that dimension.

- Exactly once per file content: the cursor maps each file to its content version
  (batch_assets/stages/sources/versions.py: a local file's digest, hashed again only when its stat changed; on S3
  the ETag or the object's checksum). A file is requested when its version differs from the cursor's, so a file
  rewritten with other bytes is processed once more, and one touched, copied over or re-uploaded with the same
  bytes is not; the run key `<partition>@<digest>` makes Dagster drop a repeated request even if a tick were
  evaluated twice. The daemon stores the cursor in the instance, so a restart repeats nothing. Only files that
  are ready (below) are hashed: a file still being written costs a listing, not a read.
- Never half-written: `ready: min_age` waits until a file has been unchanged for `min_age_seconds`; `ready:
  marker` waits for a `_SUCCESS` marker in the file's folder at least as new as the file. Names starting with
  `.` or `_` (temporary and marker files) are never data.
- Throttled: at most `max_runs_per_tick` new partitions per evaluation, oldest file first, and nothing while
  `max_queued_runs` runs of the pipeline wait in the queue; files left over stay out of the cursor and come in
  later ticks. A dump of 10,000 files therefore becomes a steady trickle of runs that the run queue
  (`max_concurrent_runs`) drains. We keep one partition per file rather than batching files into partitions:
  the partition is the unit of exactly-once, of reprocessing a rewritten file and of the UI's status, and a
  partition made of several files would have to remember which ones, outside Dagster.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import dagster as dg

from batch_assets.errors import PipelineError
from batch_assets.orchestration.assets import lineage
from batch_assets.orchestration.assets.factory import STORAGE_KEY
from batch_assets.orchestration.assets.lineage import file_modified
from batch_assets.orchestration.launch import claims
from batch_assets.orchestration.launch.claims import LAUNCHED_BY_TAG
from batch_assets.partition_files import is_data_path
from batch_assets.partitions import MULTI_KEY_FORBIDDEN, dimension_keys, partition_kind, partitions_def_for
from batch_assets.sample_data import ensure_sample
from batch_assets.spec import PipelineSpec
from batch_assets.stage_names import ASSET_NAMES
from batch_assets.stages.sources.versions import content_version
from batch_assets.storage import ArrowStorage, filesystem_for

SOURCE_FILE_TAG = "batch/source_file"
CURSOR_PREFIX = "z1:"
WAITING_STATUSES = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING]


@dataclass(frozen=True)
class SourceFile:
    url: str
    key: str
    modified: float  # seconds since the epoch
    info: dict[str, Any] = field(compare=False, repr=False)  # the listing's: S3 answers its ETag from it
    version: str = ""  # content version (with_versions): changes only when the bytes change


def sensor_name(spec: PipelineSpec) -> str:
    return f"{spec.name}_new_files_sensor"


def encode_cursor(seen: dict[str, str]) -> str:
    """The cursor holds one entry per file: compressed, 10,000 files take a few hundred kB, not megabytes."""
    raw = json.dumps(seen, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return CURSOR_PREFIX + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def decode_cursor(cursor: str | None) -> dict[str, str]:
    if not cursor:
        return {}
    if not cursor.startswith(CURSOR_PREFIX):
        raise ValueError(f"unrecognised sensor cursor (expected prefix {CURSOR_PREFIX!r}); reset it in the UI")
    return json.loads(zlib.decompress(base64.b64decode(cursor[len(CURSOR_PREFIX):])))


_modified = file_modified


def _placeholders(spec: PipelineSpec) -> list[str]:
    """The names a file's path gives a key for: {partition}, or each dimension of multi partitioning."""
    return partition_kind(spec).placeholders(spec)


def _key_pattern(path: str, names: list[str]) -> re.Pattern[str]:
    """A regex over file paths with one group per placeholder (a placeholder repeated must match the same)."""
    glob_part = lambda text: re.escape(text).replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")  # noqa: E731
    pieces = re.split(r"\{(" + "|".join(map(re.escape, names)) + r")\}", path)
    regex, seen = "^", set()
    for i, piece in enumerate(pieces):  # text, name, text, name, ..., text
        if i % 2 == 0:
            regex += glob_part(piece)
        elif piece in seen:
            regex += f"(?P={piece})"
        else:
            seen.add(piece)
            regex += f"(?P<{piece}>[^/]+?)"
    return re.compile(regex + "$")


def _file_key(spec: PipelineSpec, match: re.Match[str], names: list[str]) -> str:
    return partition_kind(spec).key_of(spec, {name: match[name] for name in names})


def list_source_files(spec: PipelineSpec) -> list[SourceFile]:
    """Every data file under the source path with its partition key and version, oldest first."""
    pattern = spec.source.path
    fs, path = filesystem_for(pattern)
    names = _placeholders(spec)
    matcher = _key_pattern(path, names)
    scheme = "s3://" if pattern.startswith("s3://") else ""
    glob = re.sub(r"\{(" + "|".join(map(re.escape, names)) + r")\}", "*", path)
    found = fs.glob(glob, detail=True)
    files = []
    for name, info in found.items():
        if info.get("type") == "directory" or not is_data_path(name, glob):
            continue  # temporary files of atomic writers, markers, writers' staging folders
        match = matcher.match(name)
        if match:
            files.append(SourceFile(scheme + name, _file_key(spec, match, names), _modified(info), info))
    return sorted(files, key=lambda f: (f.modified, f.url))


def with_versions(files: Iterable[SourceFile], storage: ArrowStorage) -> list[SourceFile]:
    """The files with their content versions (a local file is read only when its stat changed since it was last
    hashed; S3: the ETag or checksum, no download)."""
    root = storage.resolved_root()
    found = []
    for f in files:
        try:
            found.append(replace(f, version=content_version(f.url, f.info, cache_root=root)))
        except FileNotFoundError:  # removed since the listing (a writer's rename, a clean-up): not data any more
            continue
    return found


def ready_files(spec: PipelineSpec, files: Iterable[SourceFile], now: float) -> list[SourceFile]:
    """The files a writer has finished: old enough, or covered by a newer `_SUCCESS` marker in their folder."""
    cfg = spec.sensor
    assert cfg is not None
    if cfg.ready == "min_age":
        return [f for f in files if now - f.modified >= cfg.min_age_seconds]
    fs, _ = filesystem_for(spec.source.path)
    markers: dict[str, float | None] = {}
    ready = []
    for f in files:
        folder = f.url.rsplit("/", 1)[0]
        if folder not in markers:
            _, marker_path = filesystem_for(f"{folder}/{cfg.marker}")
            try:
                markers[folder] = _modified(fs.info(marker_path))
            except FileNotFoundError:
                markers[folder] = None
        stamp = markers[folder]
        if stamp is not None and stamp >= f.modified:
            ready.append(f)
    return ready


def evaluate(spec: PipelineSpec, job_name: str, context: dg.SensorEvaluationContext,
             storage: ArrowStorage | None = None) -> dg.SensorResult | dg.SkipReason:
    cfg = spec.sensor
    assert cfg is not None
    storage = storage or ArrowStorage()
    pdef = partitions_def_for(spec)
    if spec.source.sample:  # a demo pipeline: its files appear on the first tick of a fresh clone, where none are
        made = ensure_sample(spec)
        if made:
            context.log.info(f"Generated {len(made)} sample files for {spec.name}; they are picked up once ready")
    seen = decode_cursor(context.cursor)
    listing = list_source_files(spec)
    complete = ready_files(spec, listing, time.time())
    # hashed only once ready: a file still being written would be read again at every tick
    ready = [f for f in with_versions(complete, storage) if seen.get(f.url) != f.version]
    if not ready:
        done = {f.url for f in complete}
        pending = [f for f in listing if f.url not in done]
        if pending:
            return dg.SkipReason(f"{len(pending)} new or modified file(s) still being written (ready: {cfg.ready})")
        return dg.SkipReason(f"no new or rewritten files under {spec.source.path} (same bytes: same version)")
    waiting = context.instance.get_runs_count(dg.RunsFilter(job_name=job_name, statuses=WAITING_STATUSES))
    budget = min(cfg.max_runs_per_tick, cfg.max_queued_runs - waiting)
    if budget <= 0:
        return dg.SkipReason(f"{waiting} runs of {job_name} are waiting (max_queued_runs {cfg.max_queued_runs}); "
                             f"{len(ready)} ready file(s) wait for a later tick")

    busy = lineage.runs_in_flight(context.instance, spec, job_name)
    by_key: dict[str, list[SourceFile]] = {}
    waiting_on: dict[str, Any] = {}
    for f in ready:  # oldest first, so a flood is worked through in arrival order
        if f.key in busy:  # another launch path is making it: look again once that run is done
            waiting_on[f.key] = busy[f.key]
        elif f.key in by_key or len(by_key) < budget:
            by_key.setdefault(f.key, []).append(f)
    dynamic = _dynamic_part(spec, pdef)
    requests, new_keys, rejected, adopted = [], [], [], {}
    claimed: dict[str, claims.Claim] = {}
    for key, key_files in by_key.items():
        if not _is_partition(spec, pdef, key, context.instance):  # e.g. a file named for a day outside the daily partitions
            rejected.append(key)
            _mark_seen(seen, key_files)
            continue
        version = lineage.source_version(spec, key, storage)
        record = lineage.published(spec, storage, key, version)
        if record is not None:  # already published from this very file version (a backfill, a schedule, the UI)
            adopted[key] = record
            new_keys.append(key)
            _mark_seen(seen, key_files)
            continue
        held = claims.claim(storage, context.instance, spec.name, job_name, key, "sensor", version)
        if held is not None:  # the schedule requested this day at this same moment: look again next tick
            claimed[key] = held
            continue
        _mark_seen(seen, key_files)
        digest = hashlib.blake2b("|".join(f.version for f in key_files).encode(), digest_size=6).hexdigest()
        requests.append(dg.RunRequest(
            run_key=f"{key}@{digest}",
            partition_key=key,
            tags={LAUNCHED_BY_TAG: "sensor", SOURCE_FILE_TAG: key_files[-1].url[-200:]},
        ))
        new_keys.append(key)
    if adopted:
        context.log.info(f"Adopted {len(adopted)} partition(s) whose published output already matches the file "
                         f"(no run): " + ", ".join(f"{k} (made by {lineage.describe(r)})" for k, r in
                                                    list(adopted.items())[:5]))
    if waiting_on:
        context.log.info("Not requested, another run is making them (looked at again next tick): " + ", ".join(
            f"{k}: {lineage.launched_by(r)}" for k, r in list(waiting_on.items())[:5]))
    if claimed:
        context.log.info("Not requested, another launch path requested them (looked at again next tick): " +
                         ", ".join(f"{k}: {c.describe()}" for k, c in list(claimed.items())[:5]))
    if rejected:
        context.log.warning(f"{len(rejected)} file(s) match no partition of {spec.name} and are skipped: "
                            f"{', '.join(rejected[:5])}")
    live = {f.url for f in listing}
    seen = {url: version for url, version in seen.items() if url in live}  # deleted files leave the cursor
    add = []
    if dynamic is not None and new_keys:
        dynamic_def, dimension = dynamic
        existing = set(context.instance.get_dynamic_partitions(dynamic_def.name))
        wanted = [dimension_keys(spec, k)[dimension] if dimension else k for k in new_keys]
        fresh = [k for k in dict.fromkeys(wanted) if k not in existing]
        add = [dynamic_def.build_add_request(fresh)] if fresh else []
    left = len(ready) - sum(len(v) for v in by_key.values())
    if left:
        context.log.info(f"Throttled: {len(requests)} run(s) requested, {left} ready file(s) wait for later ticks")
    events = adoption_events(spec, storage, context.instance, adopted)
    if not requests and not add and not events and not rejected:
        # nothing to launch: still save the cursor (files adopted or waiting), with the reason as the tick's
        reason = (f"{len(adopted)} file(s) already published from the same version (adopted, no run)" if adopted
                  else f"{len(waiting_on) + len(claimed)} file(s) are being processed by other runs")
        return dg.SensorResult(skip_reason=dg.SkipReason(reason), cursor=encode_cursor(seen))
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=add, asset_events=events,
                           cursor=encode_cursor(seen))


def _dynamic_part(spec: PipelineSpec, pdef: dg.PartitionsDefinition,
                  ) -> tuple[dg.DynamicPartitionsDefinition, str | None] | None:
    """The dynamic partitions a new file's key is added to: the pipeline's (dimension None), a multi pipeline's
    dynamic dimension (its name), or None."""
    if isinstance(pdef, dg.DynamicPartitionsDefinition):
        return pdef, None
    if isinstance(pdef, dg.MultiPartitionsDefinition):
        for dim in pdef.partitions_defs:
            if isinstance(dim.partitions_def, dg.DynamicPartitionsDefinition):
                return dim.partitions_def, dim.name
    return None


def _is_partition(spec: PipelineSpec, pdef: dg.PartitionsDefinition, key: str, instance: dg.DagsterInstance) -> bool:
    """Whether a file's key names a partition: any key of a dynamic partitioning or dimension (the sensor adds
    it), a key of the others' (a day in the daily range, a listed static key)."""
    if isinstance(pdef, dg.DynamicPartitionsDefinition):
        return True
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        if not isinstance(pdef, dg.MultiPartitionsDefinition):
            return pdef.has_partition_key(key)
        try:
            by_dimension = dimension_keys(spec, key)
        except PipelineError:  # a file name holding '|': no key of either dimension
            return False
        return all(
            not any(c in by_dimension[dim.name] for c in MULTI_KEY_FORBIDDEN)
            and (isinstance(dim.partitions_def, dg.DynamicPartitionsDefinition)
                 or dim.partitions_def.has_partition_key(by_dimension[dim.name]))
            for dim in pdef.partitions_defs)


def _mark_seen(seen: dict[str, str], files: list[SourceFile]) -> None:
    for f in files:
        seen[f.url] = f.version


def adoption_events(spec: PipelineSpec, storage: ArrowStorage, instance: dg.DagsterInstance,
                    adopted: dict[str, dict[str, Any]]) -> list[dg.AssetMaterialization]:
    """Materializations for adopted partitions the instance has never seen materialized (outputs made under
    another instance, or before the pipeline had a sensor), so the UI shows them as done, made by whom."""
    events = []
    for stage in ASSET_NAMES:
        asset_key = dg.AssetKey([spec.name, stage])
        missing = [k for k in adopted if k not in instance.get_materialized_partitions(asset_key)]
        for key in missing:
            record = lineage.read_record(storage, spec.name, stage, key) or adopted[key]
            events.append(dg.AssetMaterialization(
                asset_key=asset_key, partition=key,
                description=f"Adopted by the sensor: made by {lineage.describe(record)} from the same source "
                            "file version and spec; not run again.",
                metadata={"adopted": True, "made_by_run": str(record.get("run_id", "")),
                          "path": dg.MetadataValue.path(str(record.get("path", ""))),
                          "dagster/row_count": int(record.get("rows", 0))}))
    return events


def build_sensor(spec: PipelineSpec, job_name: str) -> dg.SensorDefinition | None:
    if spec.sensor is None:
        return None
    cfg = spec.sensor

    @dg.sensor(
        name=sensor_name(spec),
        job_name=job_name,
        minimum_interval_seconds=cfg.interval_seconds,
        required_resource_keys={STORAGE_KEY},
        default_status=dg.DefaultSensorStatus.RUNNING if cfg.running else dg.DefaultSensorStatus.STOPPED,
        description=f"One run per new or rewritten file under {spec.source.path} (ready: {cfg.ready}; at most "
        f"{cfg.max_runs_per_tick} per tick).",
    )
    def _new_files(context: dg.SensorEvaluationContext):
        return evaluate(spec, job_name, context, getattr(context.resources, STORAGE_KEY))

    return _new_files
