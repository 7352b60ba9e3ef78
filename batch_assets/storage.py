"""Streaming Arrow storage on a local folder or any s3:// prefix, with atomic partition replacement.

Every partition of every stage is one Parquet file written row group by row group as record batches arrive, so
memory is bounded by the batch size, never by the partition. A partition becomes visible only when complete:
- local disk: the file is written beside its target under a temporary name, fsynced, then `os.replace`d;
- S3: the file is a multipart upload that is completed only on success and aborted on failure, and an S3
  object only appears (or replaces the previous version) when its upload completes.
Re-materializing a partition therefore replaces it exactly: readers see the old file or the new one, never a mix.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import dagster as dg
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pydantic import Field

from batch_assets.errors import PipelineError
from batch_assets.stage_names import WRITE
from batch_assets.resources.provider_errors import MissingExtraError

DEFAULT_STORAGE_ROOT = "data/storage"
S3_BLOCK_SIZE = 16 * 2**20  # multipart part size: the most an S3 upload buffers in memory


def is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


SHARED_ROOT_ENV = "BATCH_STORAGE_ROOT_SHARED"


def check_root_for_executor(root: str) -> None:
    """Under BATCH_EXECUTOR=k8s every step runs in its own pod, usually on another node: a local storage root is a
    different, empty folder in each, so prepare would find no raw rows and the outputs would vanish with the pod.
    Refused unless the deployment says the path is one volume mounted at the same path in every pod."""
    if os.environ.get("BATCH_EXECUTOR") != "k8s" or is_remote(root):
        return
    if os.environ.get(SHARED_ROOT_ENV, "").strip().lower() in ("1", "true", "yes"):
        return
    raise PipelineError(
        f"storage root {root!r} is a local folder, but BATCH_EXECUTOR=k8s runs every step in its own pod: each "
        "would write to its own disk, and the outputs would be lost with the pod",
        file=root,
        fix="set BATCH_STORAGE_ROOT to s3://bucket/prefix in k8s/config.yaml (docs/deployment.md); or, if this path "
            f"is a ReadWriteMany volume mounted at the same path in every pod, say so with {SHARED_ROOT_ENV}=1",
    )


PROJECT_ROOT_ENV = "BATCH_PROJECT_ROOT"
PROJECT_FILES = ("dg.toml", "pyproject.toml")  # what makes a folder a Dagster (dg) or Python project


def _installed(folder: Path) -> bool:
    """Inside an installed package's tree: a project is never there, whatever pyproject.toml a wheel carries."""
    return any(part in ("site-packages", "dist-packages") for part in folder.parts)


@functools.lru_cache(maxsize=256)
def _project_at_or_above(folder: Path) -> Path | None:
    # cached: filesystem_for asks for every relative path, and a project's files do not come and go during a run
    for candidate in (folder, *folder.parents):
        if _installed(candidate):
            return None
        if any((candidate / name).is_file() for name in PROJECT_FILES):
            return candidate
    return None


def project_root(start: str | Path | None = None) -> Path:
    """The one folder relative local paths resolve against (sources, sinks, the storage root, sample data, dead
    letters, caches: every local path the product reads or writes):

    1. $BATCH_PROJECT_ROOT, when set;
    2. the Dagster (dg) project the pipeline belongs to: the nearest folder at or above `start` (the spec file or the
       Component's defs.yaml) that holds a pyproject.toml or dg.toml. With no `start` (the storage root, shared by
       every pipeline), the project at or above the current directory, where `dg` and `dagster` run;
    3. else the current directory.

    Never a folder inside site-packages: an installed copy of this package (whose built-in pipelines' files are
    there) resolves against the user's project, so nothing is ever written into the virtualenv."""
    env = os.environ.get(PROJECT_ROOT_ENV, "").strip()
    if env:
        return Path(env).expanduser().resolve()
    cwd = Path.cwd().resolve()
    if start is not None:
        found = _project_at_or_above(Path(start).expanduser().resolve())
        if found is not None:
            return found
    found = _project_at_or_above(cwd)
    if found is None and _installed(cwd):
        raise PipelineError(
            "relative paths would resolve inside an installed package: the current directory is in site-packages "
            "and no project was found", file=str(cwd),
            fix=f"run from your project's folder, or set {PROJECT_ROOT_ENV} to the folder relative paths should "
            "resolve against")
    return found or cwd


def resolve_local(path: str, start: str | Path | None = None) -> str:
    """A local path made absolute: relative ones against `project_root(start)`, so a spec means the same from any
    cwd and an installed package never writes into site-packages."""
    path = path.removeprefix("file://")
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else project_root(start) / p)


def shown_path(url: str) -> str:
    """What an error names: the absolute path a relative local path resolved to, or the URL as given."""
    return url if is_remote(url) else resolve_local(url)


def s3_options_from_env() -> dict[str, Any]:
    """Endpoint and region come from the environment at run time; credentials from boto's usual chain."""
    client_kwargs: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client_kwargs["region_name"] = region
    return {"client_kwargs": client_kwargs}


# S3 answers that mean the credentials were refused (unknown key id, wrong secret, expired token, no permission):
# retrying cannot fix them, so they fail the step at once with the fix instead of a botocore traceback.
REFUSED_CREDENTIAL_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                            "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "403"}


def credentials_refused(exc: BaseException) -> bool:
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    return (code in REFUSED_CREDENTIAL_CODES or isinstance(exc, PermissionError)
            or type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"))


def storage_access_refused(url: str, exc: BaseException):
    """The PipelineError for S3 refusing the credentials at `url` under the storage root (no secret is in it:
    S3's message names at most the key id)."""
    error = getattr(exc, "response", {}).get("Error", {})
    detail = f"{error.get('Code')}: {error.get('Message')}" if error else f"{type(exc).__name__}: {exc}"
    return PipelineError(
        f"S3 refused the credentials for the storage root at {url} ({detail})", file=url,
        fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the pod's IAM role) where the "
        "pipeline runs to a key that may read and write this bucket, or point the storage root (BATCH_STORAGE_ROOT / "
        "the storage resource's `root`) at a bucket those credentials may use",
    )


# Environment variables that decide which S3 endpoint and credentials an S3 filesystem uses.
_S3_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID",
           "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
           "AWS_CONFIG_FILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
_s3_filesystems: dict[tuple, Any] = {}


def _s3_filesystem(s3fs) -> fsspec.AbstractFileSystem:
    """One S3 filesystem per process and S3 environment. Creating one builds a botocore client (service model,
    endpoint resolution, credential chain): about a second on a loaded machine, against 15-50 ms for a request, and
    a stage made dozens of them per partition. Endpoint and credentials are still read from the environment each
    call: a changed variable (tests, long-lived code servers) gets a new filesystem. Listings are never cached
    (use_listings_cache=False), so a file another process wrote or removed is seen at once, as with a new instance."""
    key = (os.getpid(), tuple(os.environ.get(name) for name in _S3_ENV))
    fs = _s3_filesystems.get(key)
    if fs is None:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **s3_options_from_env())
        _s3_filesystems.clear()  # a changed environment or a forked child: the old ones are not used again
        _s3_filesystems[key] = fs
    return fs


def filesystem_for(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path within it) for a local path or an s3:// URL."""
    if url.startswith("s3://"):
        try:
            import s3fs
        except ImportError as exc:
            raise MissingExtraError("s3fs", "s3", f"the s3:// path {url}") from exc

        return _s3_filesystem(s3fs), url.removeprefix("s3://")
    if is_remote(url):
        fs, path = fsspec.core.url_to_fs(url)
        return fs, path
    return LocalFileSystem(), resolve_local(url)


def open_input(url: str, block_size: int | None = None) -> IO[bytes]:
    """A source file (a local path or an s3:// URL, as a files source's `file_path` holds it) opened for binary
    reading, through the same filesystems as the rest of the storage layer (one S3 client per process). Streamed,
    never read whole here: the stage that needs the bytes reads what it needs, one file at a time. A missing file
    or object raises FileNotFoundError and a refused one PermissionError, both naming the URL, so the caller can
    make it that row's error. `block_size`: how much an object store reads ahead per request (s3fs's default when
    None); a local file ignores it."""
    fs, path = filesystem_for(url)
    try:
        return fs.open(path, "rb") if block_size is None else fs.open(path, "rb", block_size=block_size)
    except FileNotFoundError:
        raise FileNotFoundError(f"{shown_path(url)}: no such file or object") from None
    except PermissionError as exc:
        raise PermissionError(f"{shown_path(url)}: access refused ({exc})") from None
    except IsADirectoryError:
        raise FileNotFoundError(f"{shown_path(url)}: is a folder, not a file") from None


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts)])


def partition_file_name(partition: str, ext: str) -> str:
    """Partition keys can hold any character (dynamic keys, time windows): quote them for paths."""
    return urllib.parse.quote(partition, safe="-_.=") + f".{ext}"


@contextmanager
def atomic_output(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[IO[bytes]]:
    """A binary file that appears at `path` only if the block exits without an exception."""
    if isinstance(fs, LocalFileSystem):
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return
    # Object stores: autocommit=False keeps the upload pending until commit(); discard() aborts it.
    f = fs.open(path, "wb", autocommit=False, block_size=S3_BLOCK_SIZE)
    try:
        yield f
    except BaseException:
        f.discard()
        f.closed = True  # discarded: nothing may flush it later (fsspec files flush on garbage collection)
        raise
    f.close()
    f.commit()


class ParquetPartitionWriter:
    """Writes record batches to one Parquet file; the schema comes from `schema` or the first batch."""

    def __init__(self, sink: IO[bytes], schema: pa.Schema | None = None):
        self._sink = sink
        self._schema = schema
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0
        # written into the file footer at close (e.g. the read stage's row id fingerprint of the source)
        self.key_value_metadata: dict[str, str] = {}

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if self._writer is None:
            self._schema = self._schema or batch.schema
            self._writer = pq.ParquetWriter(self._sink, self._schema, compression="zstd")
        if batch.schema != self._schema:
            batch = batch.select(self._schema.names).cast(self._schema)
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        self._writer.write_table(table)
        self.rows += batch.num_rows

    def schema_if_empty(self, schema: pa.Schema) -> None:
        """The schema to write when no batch comes (an empty partition still gets its typed columns)."""
        if self._writer is None and self._schema is None:
            self._schema = schema

    def abort(self) -> None:
        """Forget the half-written file: pyarrow would otherwise write a footer into it when collected."""
        if self._writer is not None:
            self._writer.is_open = False
            self._writer = None

    def close(self, empty_schema: pa.Schema | None = None) -> None:
        if self._writer is None:
            # No batch came: still write a valid, empty file so the partition exists with 0 rows.
            schema = self._schema or empty_schema or pa.schema([])
            self._writer = pq.ParquetWriter(self._sink, schema, compression="zstd")
        if self.key_value_metadata:
            self._writer.add_key_value_metadata(self.key_value_metadata)
        self._writer.close()


@contextmanager
def write_parquet(url: str, schema: pa.Schema | None = None) -> Iterator[ParquetPartitionWriter]:
    """Stream batches into `url`; the file is committed atomically when the block ends without error."""
    fs, path = filesystem_for(url)
    with atomic_output(fs, path) as f:
        writer = ParquetPartitionWriter(f, schema)
        try:
            yield writer
        except BaseException:
            writer.abort()
            raise
        writer.close(schema)


def read_batches(url: str, columns: list[str] | None = None, batch_rows: int = 4096) -> Iterator[pa.RecordBatch]:
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        # pre_buffer=False: with it, Arrow fetches every row group's bytes up front (the whole file in memory)
        pf = pq.ParquetFile(f, pre_buffer=False)
        yield from pf.iter_batches(batch_size=batch_rows, columns=columns)


def parquet_schema(url: str) -> pa.Schema:
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).schema_arrow


def parquet_footer_metadata(url: str) -> dict[bytes, bytes]:
    """The key/value metadata of a Parquet file's footer (no data is read)."""
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        return dict(pq.ParquetFile(f).metadata.metadata or {})


def parquet_rows(url: str) -> int:
    fs, path = filesystem_for(url)
    with fs.open(path, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows


def exists(url: str) -> bool:
    fs, path = filesystem_for(url)
    return fs.exists(path)


class ArrowStorage(dg.ConfigurableResource):
    """Where every stage keeps its partitions: a local folder (default) or an s3://bucket/prefix.

    S3 endpoint, region and credentials are read from the environment at run time (AWS_ENDPOINT_URL,
    AWS_REGION, AWS_ACCESS_KEY_ID, ...); they are never part of this resource's config.
    """

    root: str = Field(
        default="",
        description=f"Local folder or s3://bucket/prefix. Empty: $BATCH_STORAGE_ROOT, else {DEFAULT_STORAGE_ROOT} in "
        "the project folder ($BATCH_PROJECT_ROOT, else the project at or above the current directory). A relative "
        "folder resolves against the project folder too.",
    )

    def resolved_root(self) -> str:
        root = self.root or os.environ.get("BATCH_STORAGE_ROOT") or DEFAULT_STORAGE_ROOT
        check_root_for_executor(root)
        return root if is_remote(root) else resolve_local(root)

    def stage_url(self, pipeline: str, stage: str, partition: str) -> str:
        return join(self.resolved_root(), pipeline, stage, partition_file_name(partition, "parquet"))

    def default_sink(self, pipeline: str) -> str:
        return join(self.resolved_root(), pipeline, WRITE.asset)


# The storage resource every pipeline's assets require, as one object: each pipeline Component and the product's own
# definitions.py bring it, and Definitions.merge accepts a resource key twice only when both hold the same object.
DEFAULT_STORAGE = ArrowStorage()


def upstream_url(storage: ArrowStorage, pipeline: str, stage: str, partition: str) -> str:
    """Where an upstream stage left this partition; a clear error if it has not been materialized."""
    url = storage.stage_url(pipeline, stage, partition)
    if not exists(url):
        raise PipelineError(
            f"upstream asset {pipeline}/{stage} has no data for this partition",
            pipeline=pipeline,
            partition=partition,
            file=url,
            fix=f"materialize {pipeline}/{stage} for partition {partition!r} first (or the whole pipeline)",
        )
    return url
