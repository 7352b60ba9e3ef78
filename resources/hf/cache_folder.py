"""A folder built once and shared by every process on the machine: the ONNX export of an encoder
(resources/hf/onnx_export.py) and the converted copy of a GGUF checkpoint (resources/hf/gguf_cache.py).

- Built under a temporary name beside the target and renamed into place only when complete: a reader sees the whole
  folder or none of it, whatever kills the builder.
- Built under a file lock per key (`<root>/<key>.lock`, the `filelock` library: an `fcntl` lock the kernel drops when
  the holder dies): two processes that find it missing at once build it once, the second waits and uses the
  first's. Temporary folders left by a builder that was killed are removed by the next one.
- A folder that is not valid (`valid(folder)` false: incomplete, corrupt, of another format), or that a caller
  found would not load (`discard`), is removed under the same lock and built again, never used; removing under the
  lock means a process never removes a fresh copy that another has just put in place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _lock(root: Path, key: str):
    from filelock import FileLock

    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / f"{key}.lock"))


def ensure_folder(root: Path, key: str, valid: Callable[[Path], bool], build: Callable[[Path], None]) -> Path:
    """`root/key`, built by `build(empty folder)` when it is missing or not `valid`. OSError when the root cannot be
    written (the caller decides whether to go on without the cache)."""
    target = root / key
    if valid(target):
        return target
    with _lock(root, key):
        if valid(target):  # another process built it while this one waited for the lock
            return target
        shutil.rmtree(target, ignore_errors=True)
        for stale in root.glob(f".build-{key}-*"):  # left by a builder that was killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=root))
        try:
            build(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not valid(target):
        raise RuntimeError(f"the cache folder {target} was built but is not valid")
    return target


def discard(root: Path, key: str) -> None:
    """Remove `root/key` (it did not load), under the key's lock."""
    with _lock(root, key):
        shutil.rmtree(root / key, ignore_errors=True)
