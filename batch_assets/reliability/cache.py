"""Response cache at the provider seam: an unchanged row never costs a second model call.

`CachedProvider` wraps a provider's capability methods (generate, embed, classify, embed_images,
classify_images). For each chunk it looks every row up by key, sends only the misses to the model, stores their
successful results, and returns results in input order -- the infer loop does not know the cache exists.

Key: sha256 of (cache format version, model fingerprint, method, call parameters, the row's prepared input). The
model fingerprint is the provider class, the runtime it resolved to (`backend_used`) and the settings its class
declares `semantic` (resources/fields.py: the checkpoint fingerprint reads the same declaration): no secrets, no
knobs that cannot change an answer (batch size, concurrency, rate limits, retries, timeouts, batch mode); nested
`{env: NAME}` references are names, never values. Row errors are never cached.

Store: one small object per entry, `<storage root>/_cache/v1/<key[:2]>/<key>.json`, on local disk or S3. We chose
content-addressed objects over a library (diskcache, sqlite, lmdb: local files only, no S3; one writer lock) and over
append-only segment files (a lookup would need an index held in memory or a scan of every segment):
- concurrent writers need no lock: every write is atomic (rename on disk, a single PUT on S3), and two writers of
  the same key write the same answer for the same input, so whichever lands last is as good as the other;
- memory is bounded by one chunk: nothing is indexed in memory, a chunk's keys are fetched concurrently
  (`fs.cat` of a list: s3fs runs the GETs in parallel);
- shared across reruns, partitions and pipelines of one storage root by construction.
Cost: one object per row (delete `_cache/` to clear it; an S3 lifecycle rule can expire it).
`predict` (user model classes) is not cached: a user's batch method need not be row-independent.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from batch_assets.storage import filesystem_for, is_remote, join
from batch_assets.resources.fields import answer_settings
from batch_assets.resources.protocols import Classification, Generation

CACHE_VERSION = "v1"
CACHED_METHODS = ("generate", "embed", "classify", "embed_images", "classify_images")


def plain(value: Any) -> Any:
    """A JSON-able, deterministic form of a config value or a row input."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return {"sha256": hashlib.sha256(value).hexdigest()}
    if hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):  # a PIL image
        return {"image": [value.mode, list(value.size), hashlib.sha256(value.tobytes()).hexdigest()]}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def model_fingerprint(provider: Any) -> dict[str, Any]:
    """What identifies the model and every setting that can change its answers; no secret values."""
    cls = type(provider)
    settings = answer_settings(cls, {name: getattr(provider, name) for name in cls.model_fields})
    out = {"provider": f"{cls.__module__}.{cls.__qualname__}", "settings": plain(settings)}
    if provider.backend_used is not None:  # the runtime `backend: auto` or `precision: fast` chose (after load)
        out["backend"] = provider.backend_used
    return out


class ResponseCache:
    """Content-addressed entries under `<root>/_cache/<version>/`."""

    def __init__(self, root: str) -> None:
        self.base = join(root, "_cache", CACHE_VERSION)
        self.fs, self._base_path = filesystem_for(self.base)
        self._local = not is_remote(self.base)

    def path(self, key: str) -> str:
        return f"{self._base_path}/{key[:2]}/{key}.json"

    def get_many(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        if not keys:
            return {}
        paths = {self.path(k): k for k in keys}
        found = self.fs.cat(list(paths), on_error="omit")
        out = {}
        for path, data in found.items():
            path = path if path in paths else path.removeprefix("s3://")
            if path in paths and isinstance(data, bytes):
                try:
                    out[paths[path]] = json.loads(data)
                except ValueError:
                    continue  # a damaged entry is a miss; the next write replaces it
        return out

    def put_many(self, entries: dict[str, dict[str, Any]]) -> None:
        if not entries:
            return
        blobs = {self.path(k): json.dumps(v, separators=(",", ":")).encode() for k, v in entries.items()}
        if not self._local:
            self.fs.pipe(blobs)  # each PUT is atomic; s3fs sends them concurrently
            return
        for path, data in blobs.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # readers see the old entry, or the whole new one


def _encode(method: str, result: Any) -> dict[str, Any] | None:
    """A result as a cache entry, or None when it must not be cached (a row error)."""
    if method == "generate":
        if result.error is not None:
            return None
        return {"text": result.text, "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens, "parsed": result.parsed}
    if method in ("classify", "classify_images"):
        if result.error is not None:
            return None
        return {"label": result.label, "score": result.score}
    vector = np.asarray(result, dtype=np.float32)
    return {"f32": base64.b64encode(vector.tobytes()).decode("ascii"), "dim": int(vector.shape[0])}


def _decode(method: str, entry: dict[str, Any]) -> Any:
    if method == "generate":
        return Generation(text=entry["text"], prompt_tokens=entry.get("prompt_tokens"),
                          completion_tokens=entry.get("completion_tokens"), parsed=entry.get("parsed"))
    if method in ("classify", "classify_images"):
        return Classification(label=entry["label"], score=entry.get("score"))
    return np.frombuffer(base64.b64decode(entry["f32"]), dtype=np.float32)


class CachedProvider:
    """A provider whose capability methods consult the response cache first; everything else passes through.

    Build it with `cached(provider, cache)`: the wrapper's class is then named after the provider's
    (`CachedOpenAICompatibleProvider`), so errors still say which provider failed; `unwrapped` is the provider
    itself, for fingerprints that must not change when the cache is switched on."""

    def __init__(self, provider: Any, cache: ResponseCache) -> None:
        self._inner = provider
        self.unwrapped = provider
        self._cache = cache
        self._fingerprint = model_fingerprint(provider)
        self.hits = 0
        self.misses = 0
        for method in CACHED_METHODS:
            if callable(getattr(provider, method, None)):
                setattr(self, method, self._cached(method))

    def choose_for_partition(self, inputs: Callable[[], list[Any]]) -> dict[str, Any]:
        """The wrapped provider's per-partition choice (resources/base.py), made part of the cache key: a vector
        computed in one precision is never served to a partition running in the other."""
        chosen = self._inner.choose_for_partition(inputs)
        self._fingerprint = model_fingerprint(self._inner)  # `backend_used` now says the partition's runtime
        return chosen

    def __getattr__(self, name: str) -> Any:  # describe(), predict(), loaded, ... of the wrapped provider
        return getattr(self._inner, name)

    def _key(self, method: str, call_args: Any, row: Any) -> str:
        doc = json.dumps([CACHE_VERSION, self._fingerprint, method, plain(call_args), plain(row)],
                         sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(doc.encode()).hexdigest()

    def _cached(self, method: str) -> Callable[..., Any]:
        call = getattr(self._inner, method)

        def cached(rows: Sequence[Any], *args: Any, on_answer: Callable[[int, Any], None] | None = None) -> Any:
            keys = [self._key(method, args, row) for row in rows]
            found = self._cache.get_many(sorted(set(keys)))
            miss = [i for i, k in enumerate(keys) if k not in found]
            self.hits += len(rows) - len(miss)
            self.misses += len(miss)
            # each answer as it arrives (the answer journal), at its position among `rows`, not among the misses
            kwargs = {} if on_answer is None else {"on_answer": lambda j, result: on_answer(miss[j], result)}
            fresh = call([rows[i] for i in miss], *args, **kwargs) if miss else []
            if len(fresh) != len(miss):
                raise RuntimeError(f"{type(self._inner).__name__}.{method} returned {len(fresh)} results for "
                                   f"{len(miss)} rows")
            new = {}
            for i, result in zip(miss, fresh):
                entry = _encode(method, result)
                if entry is not None:
                    new[keys[i]] = entry
            self._cache.put_many(new)
            out: list[Any] = [None] * len(rows)
            for i, result in zip(miss, fresh):
                out[i] = result
            missed = set(miss)
            for i, k in enumerate(keys):
                if i not in missed:
                    out[i] = _decode(method, found[k])
            if method in ("embed", "embed_images"):
                return np.stack(out) if out else np.empty((0, 0), np.float32)
            return out

        return cached


def cached(provider: Any, cache: ResponseCache) -> CachedProvider:
    cls = type(f"Cached{type(provider).__name__}", (CachedProvider,), {"__module__": __name__})
    return cls(provider, cache)
