"""A sentence-transformers model exported once to ONNX, cached next to the model, checked against torch.

The whole model is exported (transformer, pooling, normalisation: the model's own modules, as `modules.json` lists
them), so the graph's output is `encode`'s vector. Export uses `torch.onnx.export` (the TorchScript exporter: 4x
faster to export than the dynamo one here, and onnxruntime ran its graph faster); `sentence-transformers[onnx]` is not
used (it downgrades transformers and fails to import, ../shared/ENVIRONMENT.md).

The cache (one folder per key) holds `model.onnx`, the tokenizer the model uses (`tokenizer.json`, with its
truncation at the model's max length) and `manifest.json`: the graph's inputs, the model's max length and dimension,
the sha256 of the graph, and the fidelity of each runtime, min cosine against torch's vectors over `PROBE_TEXTS`.
- Key: the model (its name, its folder, and every file's name, size and mtime: the revision) and the versions of
  torch, transformers, sentence-transformers, onnx, onnxruntime and openvino. Any change exports again.
- Where: `$BATCH_ONNX_CACHE` if set, else `<model folder>/.onnx-cache/` if the folder is writable and not inside an
  installed package, else `$XDG_CACHE_HOME/batch-assets/onnx/` (`~/.cache/...`). The shipped MiniLM lives in
  site-packages: a run never writes into a virtualenv's packages, which belong to the installer (a reinstall or
  `pip uninstall` would leave or lose the cache; a read-only image would differ from a writable venv).
- Written atomically, once across processes (resources/hf/cache_folder.py, shared with the GGUF cache): exported into
  a temporary folder and renamed into place, under a file lock, so two processes exporting at once leave one complete
  folder (the second one waits and reuses it). A folder whose manifest does not parse or whose graph's sha256 differs
  is corrupt: it is removed under the lock and exported again, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from batch_assets.resources.hf.cache_folder import ensure_folder
from batch_assets.resources.hf.onnx_encoder import FIDELITY_MIN, Exported, ExportedEncoder, min_cosine

FORMAT = 1
CACHE_ENV = "BATCH_ONNX_CACHE"
RUNTIMES = ("onnx", "openvino")  # onnx = onnxruntime; openvino = OpenVINO reading the same graph
_VERSIONED = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "openvino")
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BACKENDS = ("auto", "torch", "onnx", "openvino")
AUTO_ORDER = ("openvino", "onnx")  # by measurement (docs/BENCHMARKS.md, "Runtimes for encoders"); then torch
_ACCELERATOR_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")

# The probe the fidelity is measured on: short and long, messy and clean. The long ones run past the model's max
# length, so truncation is compared too.
PROBE_TEXTS: tuple[str, ...] = (
    "A new line of electric bikes went on sale in Lisbon this week.",
    "Quarterly revenue rose 12% on strong cloud demand, the company said.",
    "the cat sat on the mat",
    "   leading and trailing spaces   ",
    "tab\tseparated\tand\nnew\nlines",
    "ÜNÏCÖDÉ àccents, ñ, ß, 日本語のテキスト, emoji 🙂🚀",
    "<p>Some <b>HTML</b> &amp; entities</p>",
    "MiXeD CaSe AnD NuMbErS 1234567890",
    "\u200bzero\u200bwidth and\u00a0no-break spaces",
    "a",
    "?!",
    "URL https://example.com/a/b?c=d&e=f and mail someone@example.org",
    " ".join(["word"] * 600),
    "x" * 3000,
    " ".join(f"token{i} of a long technical document about databases and indexes" for i in range(80)),
)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def revision(folder: Path) -> str:
    """The model folder's files (name, size, mtime), without reading the weights."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if rel.parts[0] == ".onnx-cache" or not path.is_file():
            continue
        st = path.stat()
        h.update(f"{rel}\x00{st.st_size}\x00{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cache_root(folder: Path) -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    installed = any(part in ("site-packages", "dist-packages") for part in folder.resolve().parts)
    if os.access(folder, os.W_OK) and not installed:
        return folder / ".onnx-cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "batch-assets" / "onnx"


def cache_key(name: str, folder: Path) -> str:
    material = {"format": FORMAT, "model": name, "folder": str(folder.resolve()), "revision": revision(folder),
                "versions": versions()}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def read_cache(folder: Path) -> Exported | None:
    """The cache folder if it is complete and intact, else None (cache_folder.py removes and rebuilds it under the
    key's lock)."""
    if not folder.exists():
        return None
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError("another format")
        if manifest.get("problem") is None:
            if _sha256(folder / "model.onnx") != manifest["sha256"] or not (folder / "tokenizer.json").is_file():
                raise ValueError("graph or tokenizer differs from the manifest")
        return Exported(folder, manifest)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_exported(name: str, folder: Path) -> Exported:
    """The cached export of the model in `folder` (exported now when missing or corrupt, once across processes:
    resources/hf/cache_folder.py). An export that failed is cached too (its manifest says why), so a model that
    cannot be exported costs one attempt per key."""

    def build(out: Path) -> None:
        manifest = export(folder, out)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))

    target = ensure_folder(cache_root(folder), cache_key(name, folder), lambda f: read_cache(f) is not None, build)
    found = read_cache(target)
    if found is None:
        raise RuntimeError(f"the ONNX export of {name!r} in {target} did not read back")
    return found


def export(folder: Path, out: Path) -> dict[str, Any]:
    """Export the model in `folder` into `out` and measure each runtime against torch. Returns the manifest."""
    start = time.perf_counter()
    manifest: dict[str, Any] = {"format": FORMAT, "versions": versions(), "problem": None, "fidelity": {}}
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        return {**manifest, "problem": f"cannot export: {exc}"}
    try:
        model = SentenceTransformer(str(folder), device="cpu").eval()
    except Exception as exc:  # not a model sentence-transformers loads: nothing to export
        return {**manifest, "problem": f"sentence-transformers cannot load it: {type(exc).__name__}: {exc}"}
    tokenizer = getattr(model.tokenizer, "backend_tokenizer", None)
    if tokenizer is None:
        return {**manifest, "problem": "the model's tokenizer is not a fast (tokenizers) one"}
    features = model.preprocess(list(PROBE_TEXTS))
    inputs = [k for k in _INPUTS if k in features]
    extra = [k for k, v in features.items() if isinstance(v, torch.Tensor) and k not in inputs]
    if "input_ids" not in inputs or extra:
        return {**manifest, "problem": f"inputs other than {list(_INPUTS)}: {extra}"}

    class Whole(torch.nn.Module):  # the model's modules in order, as encode runs them
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return self.model(dict(zip(inputs, tensors)))["sentence_embedding"]

    args = tuple(features[k] for k in inputs)
    axes = {k: {0: "batch", 1: "sequence"} for k in inputs}
    try:
        with torch.no_grad():
            torch.onnx.export(Whole().eval(), args, str(out / "model.onnx"), input_names=inputs,
                              output_names=["sentence_embedding"], opset_version=17, dynamo=False,
                              dynamic_axes={**axes, "sentence_embedding": {0: "batch"}})
    except Exception as exc:  # an architecture the exporter cannot trace: torch it is
        return {**manifest, "problem": f"torch.onnx.export failed: {type(exc).__name__}: {exc}"}
    tok = tokenizer.__class__.from_str(tokenizer.to_str())  # a copy: the model's own stays as it was
    tok.no_padding()
    tok.enable_truncation(max_length=int(model.max_seq_length))
    tok.save(str(out / "tokenizer.json"))
    manifest.update(
        sha256=_sha256(out / "model.onnx"), model_folder=str(folder), inputs=inputs,
        max_seq_length=int(model.max_seq_length),
        dimension=int(model.get_embedding_dimension()), pad_id=int(model.tokenizer.pad_token_id or 0),
        export_seconds=round(time.perf_counter() - start, 2),
    )
    reference = model.encode(list(PROBE_TEXTS), batch_size=8, convert_to_numpy=True, show_progress_bar=False)
    ids = [e.ids for e in tok.encode_batch(list(PROBE_TEXTS))]
    same_tokens = ids == [row[mask.bool()].tolist() for row, mask in zip(features["input_ids"],
                                                                           features["attention_mask"])]
    manifest["tokenizer_matches"] = same_tokens
    for runtime in RUNTIMES:
        try:
            encoder = ExportedEncoder(Exported(out, manifest), runtime)
        except ImportError:
            continue
        vectors = encoder.encode(list(PROBE_TEXTS), batch_size=8)
        manifest["fidelity"][runtime] = min_cosine(vectors, reference) if same_tokens else 0.0
    return manifest




def surely_cpu(device: str) -> bool:
    """True when the model will run on the CPU, decided without importing torch: an explicit 'cpu', or 'auto' on a
    host with no GPU device node (so torch could not see one either)."""
    if device == "cpu":
        return True
    if device != "auto":
        return False
    if os.environ.get("BATCH_INFER_GPUS", "").strip() == "0":
        return True
    return os.uname().sysname == "Linux" and not any(os.path.exists(p) for p in _ACCELERATOR_NODES)


class BackendError(RuntimeError):
    pass


def choose(name: str, folder: Path, backend: str) -> tuple[Exported | None, str, str]:
    """(export or None, backend, why) for a model on the CPU. `backend` is the configured one."""
    if backend == "torch":
        return None, "torch", "pinned in model.config.backend"
    exported = ensure_exported(name, folder)
    problem = exported.manifest.get("problem")
    candidates = AUTO_ORDER if backend == "auto" else (backend,)
    reasons = []
    for runtime in candidates:
        score = exported.manifest.get("fidelity", {}).get(runtime)
        if problem:
            reasons.append(f"{runtime}: {problem}")
        elif score is None:
            reasons.append(f"{runtime}: its runtime is not installed "
                           f"(pip install {'onnxruntime' if runtime == 'onnx' else 'openvino'})")
        elif score < FIDELITY_MIN:
            reasons.append(f"{runtime}: min cosine to torch {score:.6f} < {FIDELITY_MIN} on the probe texts")
        else:
            how = "fastest faithful" if backend == "auto" else "pinned in model.config.backend"
            return exported, runtime, f"{how}; min cosine to torch {score:.7f}"
    if backend != "auto":
        raise BackendError(f"backend {backend!r} cannot run {name!r}: {'; '.join(reasons)}")
    return None, "torch", "no faithful exported runtime: " + "; ".join(reasons)
