"""Resume instead of redo: the infer stage commits its results chunk by chunk under the partition's staging area.

Layout (local folder or s3://, under the storage root):

    <root>/<pipeline>/_staging/inferred/<partition>/<fingerprint>/manifest.json
                                                                  /chunk-000000.parquet ...

A chunk file holds `row_id`, the task's output columns and `error` for `runtime.chunk_rows` prepared rows; it is
written atomically, then the manifest (rewritten atomically) records it with a digest of its row ids and of the
model inputs it was computed from. A rerun of the partition (step retry, run retry, re-materialization after a
crash or SIGKILL) reuses a chunk only when the fingerprint matches and the prepared rows it claims to cover have the
same ids and inputs; anything else is recomputed, never mixed. The fingerprint covers the provider and the settings
of its config that can change an answer (the fields it declares `semantic`, resources/fields.py: the response
cache's key is made of the same ones, so the two never disagree; secrets and operational settings such as batch
size, concurrency or retries are left out, so changing those keeps the committed chunks), the task, the preparation
(template, system prompt, columns), the generation params, the chunk size and the code version (this package's
version and the source of the provider, the loop and the user code the provider runs). Other fingerprints'
folders are removed when a run starts (invalidated); the whole partition folder is removed after the write stage
published the partition.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import urllib.parse
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batch_assets import tasks
from batch_assets.spec_sections import PipelineSections
from batch_assets.stage_names import INFER
from batch_assets.storage import ArrowStorage, atomic_output, filesystem_for, join
from batch_assets.resources.fields import answer_settings
from batch_assets.resources.registry import provider_class

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# The loop and the task kinds' code: what turns a chunk of prepared rows into its committed outputs.
_LOOP_SOURCES = sorted(str(p) for p in Path(tasks.__file__).parent.glob("*.py"))


def staging_url(storage: ArrowStorage, pipeline: str, partition: str, stage: str = INFER.asset) -> str:
    return join(storage.resolved_root(), pipeline, "_staging", stage, urllib.parse.quote(partition, safe="-_.="))


def _source_digest(paths: Iterable[str | None]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for path in sorted(p for p in paths if p):
        try:
            h.update(Path(path).read_bytes())
        except OSError:
            h.update(path.encode())
    return h.hexdigest()


def code_version(provider: Any) -> str:
    """This package's version plus the source of the loop, the provider's module and (custom providers) the user's
    model module: editing any of them invalidates checkpoints computed by the old code."""
    try:
        version = metadata.version("batch-assets")
    except metadata.PackageNotFoundError:
        version = "unknown"
    files = [__file__, *_LOOP_SOURCES, *provider.user_code_files()]
    for cls in type(provider).__mro__[:2]:
        try:
            files.append(inspect.getsourcefile(cls))
        except TypeError:
            pass
    return f"{version}+{_source_digest(files)}"


def fingerprint(spec: PipelineSections, provider: Any) -> str:
    provider = provider.unwrapped  # inside the response cache's wrapper: its class and code computed the rows
    material = {
        "provider": spec.model.provider,
        "provider_class": f"{type(provider).__module__}.{type(provider).__qualname__}",
        # what the spec sets that can change an answer, as the provider class declares its fields: a nested
        # `{env: NAME}` is the variable's name, never its value
        "model_config": answer_settings(provider_class(spec.model.provider), spec.model.config),
        # the runtime `backend: auto` resolved to (torch, onnx, openvino): chunks of two runtimes are never mixed
        "backend": provider.backend_used,
        "task": spec.task.model_dump(mode="json"),
        "prepare": spec.prepare.model_dump(mode="json"),
        "chunk_rows": spec.runtime.chunk_rows,
        "code": code_version(provider),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:20]


def column_digest(batch: pa.RecordBatch | pa.Table, columns: list[str]) -> str:
    """A digest of the values of `columns` (independent of how Arrow laid the buffers out)."""
    h = hashlib.blake2b(digest_size=16)
    for name in columns:
        h.update(name.encode() + b"\x00")
        for value in batch.column(name).to_pylist():
            h.update(repr(value).encode("utf-8", "surrogatepass") + b"\x1f")
    return h.hexdigest()


class ChunkCheckpoint:
    """The committed chunks of one partition's inference under one fingerprint (`stage` "retry": of the retry of
    its dead letters, kept apart from the partition's own chunks)."""

    def __init__(self, storage: ArrowStorage, spec: PipelineSections, partition: str, fp: str,
                 stage: str = INFER.asset):
        self.partition_url = staging_url(storage, spec.name, partition, stage)
        self.url = join(self.partition_url, fp)
        self.fingerprint = fp
        self.fs, self.path = filesystem_for(self.url)
        self.manifest: dict[str, Any] = {
            "fingerprint": fp, "pipeline": spec.name, "partition": partition,
            "chunk_rows": spec.runtime.chunk_rows, "chunks": {},
        }
        self.invalidated: list[str] = []

    def open(self) -> ChunkCheckpoint:
        """Drop other fingerprints' chunks (their results would be mixed with a different setup), load ours."""
        fs, base = filesystem_for(self.partition_url)
        if fs.exists(base):
            for entry in fs.ls(base, detail=False):
                name = entry.rstrip("/").rsplit("/", 1)[-1]
                if name != self.fingerprint:
                    fs.rm(entry, recursive=True)
                    self.invalidated.append(name)
        manifest_path = f"{self.path}/{MANIFEST}"
        if self.fs.exists(manifest_path):
            with self.fs.open(manifest_path, "rb") as f:
                stored = json.loads(f.read())
            if stored.get("fingerprint") == self.fingerprint:
                self.manifest["chunks"] = stored.get("chunks", {})
        return self

    @property
    def committed_chunks(self) -> int:
        return len(self.manifest["chunks"])

    def reusable(self, index: int, ids_digest: str, inputs_digest: str) -> bool:
        entry = self.manifest["chunks"].get(str(index))
        if entry is None:
            return False
        if entry["row_ids"] == ids_digest and entry["inputs"] == inputs_digest:
            return True
        log.warning("checkpoint chunk %d of %s covers other rows or inputs than the prepared chunk: recomputed",
                    index, self.url)
        return False

    def chunk_path(self, index: int) -> str:
        return f"{self.path}/chunk-{index:06d}.parquet"

    def commit(self, index: int, outputs: pa.RecordBatch, ids_digest: str, inputs_digest: str) -> None:
        """Chunk file first, then the manifest that names it: a crash between the two leaves an unlisted file that
        the next run overwrites."""
        table = pa.Table.from_batches([outputs])
        with atomic_output(self.fs, self.chunk_path(index)) as f:
            pq.write_table(table, f, compression="zstd")
        self.manifest["chunks"][str(index)] = {
            "rows": outputs.num_rows, "row_ids": ids_digest, "inputs": inputs_digest,
            "file": self.chunk_path(index).rsplit("/", 1)[-1],
        }
        with atomic_output(self.fs, f"{self.path}/{MANIFEST}") as f:
            f.write(json.dumps(self.manifest, indent=1).encode())

    def schema(self, index: int) -> pa.Schema:
        with self.fs.open(self.chunk_path(index), "rb") as f:
            return pq.ParquetFile(f).schema_arrow

    def read(self, index: int) -> pa.Table:
        with self.fs.open(self.chunk_path(index), "rb") as f:
            table = pq.read_table(f)
        expected = self.manifest["chunks"][str(index)]["rows"]
        if table.num_rows != expected:
            raise RuntimeError(f"checkpoint chunk {self.chunk_path(index)} holds {table.num_rows} rows, its manifest "
                               f"says {expected}")
        return table


def remove_partition_checkpoints(storage: ArrowStorage, pipeline: str, partition: str, stage: str = INFER.asset) -> None:
    """After publish: the partition's staged chunks are no longer needed."""
    fs, path = filesystem_for(staging_url(storage, pipeline, partition, stage))
    if fs.exists(path):
        fs.rm(path, recursive=True)
