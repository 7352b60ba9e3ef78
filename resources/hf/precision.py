"""The declared fast mode of the exported encoders (`precision: fast`), and the retrieval probe that decides whether
this machine may use it.

Exact (the default) runs the exported graph in float32: its vectors are torch's (min cosine >= 0.9999 on the
export's probe, onnx_export.py). Fast runs the same graph in bfloat16 with OpenVINO, on CPUs that compute in it
(AMX or AVX512-BF16: OpenVINO lists `BF16` among the CPU's optimisation capabilities); elsewhere there is nothing to
gain and the exact vectors are used. Fast is used only where the probe keeps retrieval what it was: over a fixed
corpus of real English text (the paragraphs of Python's own documentation topics, `pydoc_data`, which ships with
every CPython), each text's 10 nearest neighbours under the fast vectors against those under the exact ones, recall@10
>= `RECALL_MIN`. The exact reference is the float32 run of the same export (itself torch's vectors, above), so the
probe needs no torch.

Measured once per model export, runtime version and CPU (the result is kept beside the export, written atomically:
`precision-<key>.json`), so a run pays nothing for it after the first; the numbers go into the infer asset's
metadata (`precision`, `precision_recall_at_10`, `precision_min_cosine`, `precision_reason`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batch_assets.resources.hf.onnx_encoder import Exported, ExportedEncoder, min_cosine

log = logging.getLogger(__name__)

RECALL_MIN = 0.99  # recall@10 against the exact vectors, below which fast is not used
K = 10
FAST_RUNTIME = "openvino"
FAST_PRECISION = "bf16"
PROBE_VERSION = 1  # bump when the corpus or the measure changes: every cached verdict is measured again


@dataclass(frozen=True)
class Verdict:
    """What the probe found for one export on this machine."""

    usable: bool
    reason: str
    recall_at_10: float | None = None
    min_cosine: float | None = None
    mean_cosine: float | None = None
    probe_texts: int = 0
    seconds: float = 0.0


def probe_corpus() -> list[str]:
    """Paragraphs of Python's documentation topics: real English prose on related subjects (many close neighbours,
    which is what a lower precision would reorder first), 60-400 characters, deduplicated, in a fixed order."""
    from pydoc_data.topics import topics

    seen: set[str] = set()
    out = []
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(paragraph.split())
            if not 60 <= len(text) <= 400 or text.startswith((">>>", "...")):
                continue
            if sum(c.isalpha() for c in text) < 0.7 * len(text) or text in seen:  # code listings are not prose
                continue
            seen.add(text)
            out.append(text)
    return out


def recall_at_k(exact: np.ndarray, fast: np.ndarray, k: int = K) -> float:
    """Mean share of each text's k nearest neighbours (cosine, itself left out) under `exact` that are also its k
    nearest under `fast`."""
    def neighbours(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        sims = unit @ unit.T
        np.fill_diagonal(sims, -np.inf)
        return np.argpartition(-sims, k, axis=1)[:, :k]

    a, b = neighbours(exact.astype(np.float64)), neighbours(fast.astype(np.float64))
    hits = sum(len(np.intersect1d(x, y, assume_unique=True)) for x, y in zip(a, b))
    return hits / (k * len(a))


def cpu_has_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_file(exported: Exported) -> Path:
    import openvino as ov

    material = {"probe": PROBE_VERSION, "precision": FAST_PRECISION, "sha256": exported.manifest.get("sha256"),
                "openvino": ov.get_version(), "cpu": _cpu_name(), "recall_min": RECALL_MIN}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
    return exported.folder / f"precision-{key}.json"


def measure(exported: Exported, texts: list[str] | None = None) -> Verdict:
    """Run the probe now: the corpus through the exact and the fast encoder of `exported`."""
    start = time.perf_counter()
    texts = probe_corpus() if texts is None else texts
    exact = ExportedEncoder(exported, FAST_RUNTIME).encode(texts, batch_size=32)
    fast = ExportedEncoder(exported, FAST_RUNTIME, precision=FAST_PRECISION).encode(texts, batch_size=32)
    recall = recall_at_k(exact, fast)
    cos = (exact * fast).sum(1) / np.maximum(np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1), 1e-30)
    usable = recall >= RECALL_MIN
    reason = (f"recall@{K} {recall:.4f} {'>=' if usable else '<'} {RECALL_MIN} against the exact vectors on "
              f"{len(texts)} probe texts")
    return Verdict(usable, reason, round(recall, 4), round(min_cosine(exact, fast), 6), round(float(cos.mean()), 6),
                   len(texts), round(time.perf_counter() - start, 2))


def verdict(exported: Exported) -> Verdict:
    """Whether this machine may run `exported` fast: the cached probe result, or the probe run now (and kept)."""
    if exported.manifest.get("fidelity", {}).get(FAST_RUNTIME) is None:
        return Verdict(False, "OpenVINO is not installed (pip install openvino): fast needs it")
    if not exported.faithful(FAST_RUNTIME):
        return Verdict(False, "OpenVINO's float32 vectors do not match torch's for this model: no exact reference")
    if not cpu_has_bf16():
        return Verdict(False, "this CPU has no bfloat16 (AMX or AVX512-BF16): nothing to gain, exact used")
    path = _cache_file(exported)
    try:
        return Verdict(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # not measured yet on this machine (or a damaged file): measure
    try:
        result = measure(exported)
    except ImportError:
        return Verdict(False, "no probe corpus (this Python has no pydoc_data): exact used")
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".precision-", delete=False) as f:
            json.dump(asdict(result), f)
        os.replace(f.name, path)  # atomic: a reader sees a whole verdict or none
    except OSError as exc:  # a read-only cache: the probe runs again next time, the run goes on
        log.warning("could not keep the precision probe's result in %s: %s", path.parent, exc)
    return result


def describe(verdict: Verdict | None, asked: str) -> dict[str, Any]:
    """The infer asset's metadata about precision."""
    if asked == "exact" or verdict is None:
        return {"precision": "exact"}
    out: dict[str, Any] = {"precision": f"fast ({FAST_PRECISION})" if verdict.usable else "exact (fast refused)",
                           "precision_reason": verdict.reason}
    if verdict.recall_at_10 is not None:
        out.update(precision_recall_at_10=verdict.recall_at_10, precision_min_cosine=verdict.min_cosine,
                   precision_mean_cosine=verdict.mean_cosine, precision_probe_texts=verdict.probe_texts)
    return out


def choose(encoder: Any, backend: str, why: str, pinned: str) -> tuple[Any, str, str, Verdict]:
    """(encoder, backend, why, verdict) for `precision: fast`, from what the exact choice loaded: the bf16 encoder
    when the probe allows it on this machine, else the exact one, with the reason."""
    if pinned in ("torch", "onnx"):
        raise ValueError(f"precision 'fast' runs the OpenVINO export, but model.config.backend pins {pinned!r}: set "
                         "backend to auto or openvino, or precision to exact")
    if not isinstance(encoder, ExportedEncoder) or encoder.backend != FAST_RUNTIME:
        return encoder, backend, why, Verdict(False, f"fast runs the OpenVINO export; this model runs with {backend} "
                                              f"({why}): exact used")
    found = verdict(encoder.exported)
    if not found.usable:
        return encoder, backend, why, found
    fast = ExportedEncoder(encoder.exported, FAST_RUNTIME, precision=FAST_PRECISION)
    return fast, f"{FAST_RUNTIME}-{FAST_PRECISION}", f"{why}; precision fast: {found.reason}", found
