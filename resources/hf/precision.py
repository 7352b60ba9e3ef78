"""The declared fast mode of the exported encoders (`precision: fast`), decided on each partition's own rows.

Exact (the default) runs the exported graph in float32: its vectors are torch's (min cosine >= 0.9999 on the
export's probe, onnx_export.py). Fast runs the same graph in bfloat16 with OpenVINO, on CPUs that compute in it
(AMX or AVX512-BF16: OpenVINO lists `BF16` among the CPU's optimisation capabilities); elsewhere there is nothing to
gain and the exact vectors are used.

Whether fast is good enough depends on the user's rows, not on a corpus of ours: bf16 kept recall@10 at 0.994 on
English prose and near-duplicate invoices, but 0.9887 on `make bench`'s documents (random arrangements of 60 words,
near-ties everywhere). So before a partition's first chunk is computed, the infer stage asks the embedder to decide
(`choose_for_partition`): `PROBE_ROWS` of the partition's own model inputs, spread evenly over it, are encoded exact
and fast, and fast is used for the whole partition only if the retrieval probe holds: each sampled row's 10 nearest
neighbours (within the sample) under the fast vectors against those under the exact ones. The bar is on a lower
bound, not on the sample's mean: recall@10 is a mean over sampled rows, and a sample of a few hundred scatters by
+-0.003 around the partition's own figure (bench corpus: 0.989-0.994 for 256-row samples of one 10,000-row set whose
recall is 0.9887), so the mean minus two standard errors must reach `RECALL_MIN`.

Decided per partition, deterministically (the same rows give the same sample, the same vectors, the same answer),
before the checkpoint's fingerprint is taken: the backend (`openvino` or `openvino-bf16`) is part of it, so a
partition is computed in one precision from its first chunk to its last, a rerun resumes in the precision it started
in, and chunks of the two are never mixed. The partition's metadata (and its lineage record) say which precision ran
and what the probe measured.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from batch_assets.resources.hf.onnx_encoder import ExportedEncoder, min_cosine

log = logging.getLogger(__name__)

RECALL_MIN = 0.99  # recall@10 against the exact vectors (lower bound over the sample), below which fast is not used
K = 10
PROBE_ROWS = 512  # rows of the partition encoded twice (exact and fast) to decide; about 1 s of exact encoding
PROBE_MIN_ROWS = 100  # below this a neighbour list says little about retrieval: such partitions run exact
FAST_RUNTIME = "openvino"
FAST_PRECISION = "bf16"
FAST_BACKEND = f"{FAST_RUNTIME}-{FAST_PRECISION}"


@dataclass(frozen=True)
class Verdict:
    """What the probe found for one partition (or why it did not run)."""

    usable: bool
    reason: str
    recall_at_10: float | None = None  # within the sample
    recall_at_size: float | None = None  # extended to the partition's rows (Estimate)
    recall_low: float | None = None  # ... less two standard errors: what the bar is applied to
    min_cosine: float | None = None
    mean_cosine: float | None = None
    probe_texts: int = 0
    seconds: float = 0.0


def per_row_recall(exact: np.ndarray, fast: np.ndarray, k: int = K) -> np.ndarray:
    """For each row, the share of its k nearest neighbours (cosine, itself left out) under `exact` that are also its
    k nearest under `fast`."""
    def neighbours(vectors: np.ndarray) -> np.ndarray:
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        sims = unit @ unit.T
        np.fill_diagonal(sims, -np.inf)
        return np.argpartition(-sims, k, axis=1)[:, :k]

    a, b = neighbours(exact.astype(np.float64)), neighbours(fast.astype(np.float64))
    return np.array([len(np.intersect1d(x, y, assume_unique=True)) / k for x, y in zip(a, b)])


def recall_at_k(exact: np.ndarray, fast: np.ndarray, k: int = K) -> float:
    """Mean share of each row's k nearest neighbours under `exact` that are also its k nearest under `fast`."""
    return float(per_row_recall(exact, fast, k).mean())


def cpu_has_bf16() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def sample(texts: list[str], rows: int = PROBE_ROWS) -> list[str]:
    """`rows` texts spread evenly over `texts` (all of them when there are fewer), distinct: a partition sorted by
    topic or date is probed across its whole range, and a repeated text would be its own perfect neighbour."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) <= rows:
        return distinct
    return [distinct[int(i)] for i in np.linspace(0, len(distinct) - 1, rows)]


@dataclass(frozen=True)
class Estimate:
    measured: float  # recall@10 within the sample
    at_size: float  # extrapolated to the partition's size
    low: float  # `at_size` less two standard errors of the sample's mean


def estimate(exact: np.ndarray, fast: np.ndarray, rows: int, k: int = K) -> Estimate:
    """recall@k of `fast` against `exact`, for a partition of `rows` rows of which these vectors are a sample.

    Recall falls as the corpus grows: more rows, more near ties at the 10th neighbour for the lower precision to
    reorder. Measured on make bench's documents (bf16): the share of neighbours lost was 0.0059 within 128 rows,
    0.0066 in 256, 0.0079 in 512, 0.0097 in 1,024, 0.0109 in 4,096, 0.0113 in 10,000: about linear in log(rows). So
    the loss is measured in sub-samples of a quarter and a half of the sample too (8 random draws each, fixed seed),
    fitted against log2(rows), and extended to the partition's `rows` (never extended downwards: a fitted gain
    from more rows would be noise)."""
    n = len(exact)
    per_row = per_row_recall(exact, fast, k)
    measured = float(per_row.mean())
    lost = 1 - measured
    if rows > n and n >= 8 * k:
        rng = np.random.default_rng(0)
        sizes, losses = [n], [lost]
        for m in (n // 4, n // 2):
            draws = [rng.choice(n, m, replace=False) for _ in range(8)]
            sizes.append(m)
            losses.append(float(np.mean([1 - per_row_recall(exact[d], fast[d], k).mean() for d in draws])))
        slope = max(0.0, float(np.polyfit(np.log2(sizes), losses, 1)[0]))
        lost += slope * float(np.log2(rows / n))
    spread = 2 * float(per_row.std(ddof=1)) / np.sqrt(n) if n > 1 else 1.0
    return Estimate(measured, 1 - lost, float(1 - lost - spread))


def measure(exact: Any, fast: Any, texts: list[str], rows: int) -> Verdict:
    """Encode the sample `texts` of a partition of `rows` rows with both encoders; usable when the lower bound of
    recall@10, extended to the partition's size, reaches `RECALL_MIN`."""
    start = time.perf_counter()
    if len(texts) < PROBE_MIN_ROWS:
        return Verdict(False, f"the partition has {len(texts)} distinct texts, fewer than the {PROBE_MIN_ROWS} the "
                       "retrieval probe needs to measure anything: exact used", probe_texts=len(texts))
    a = exact.encode(texts, batch_size=32)
    b = fast.encode(texts, batch_size=32)
    found = estimate(a, b, max(rows, len(texts)))
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    usable = bool(found.low >= RECALL_MIN)
    reason = (f"recall@{K} {found.measured:.4f} on {len(texts)} of the partition's rows, {found.at_size:.4f} "
              f"extended to its {rows} rows (lower bound {found.low:.4f}) {'>=' if usable else '<'} {RECALL_MIN} "
              "against the exact vectors")
    return Verdict(usable, reason, round(found.measured, 4), round(found.at_size, 4), round(found.low, 4),
                   round(min_cosine(a, b), 6), round(float(cos.mean()), 6), len(texts),
                   round(time.perf_counter() - start, 2))


class FastMode:
    """Both encoders of one export, and the per-partition decisions between them (kept per process by the sample's
    digest: a rerun or a dead-letter retry in the same process asks the same rows and gets the same answer at once)."""

    def __init__(self, exact: Any, backend: str, why: str, refused: Verdict | None) -> None:
        self.exact, self.exact_backend, self.why = exact, backend, why
        self.refused = refused  # why fast can never run here (machine, runtime, model), or None
        self.fast = None if refused else ExportedEncoder(exact.exported, FAST_RUNTIME, precision=FAST_PRECISION)
        self._verdicts: dict[str, Verdict] = {}
        self._lock = threading.Lock()

    def decide(self, inputs: Callable[[], list[Any]]) -> Verdict:
        """The verdict for the partition whose model inputs `inputs()` reads (not read where fast cannot run)."""
        if self.refused is not None:
            return self.refused
        texts = [str(t) for t in inputs()]
        probe, rows = sample(texts), len(set(texts))
        key = hashlib.sha256("\x1f".join([str(rows), *probe]).encode("utf-8", "surrogatepass")).hexdigest()
        with self._lock:
            if key not in self._verdicts:
                self._verdicts[key] = measure(self.exact, self.fast, probe, rows)
            return self._verdicts[key]

    def chosen(self, found: Verdict) -> tuple[Any, str, str]:
        """(encoder, backend, why) for a partition the probe let run fast."""
        return self.fast, FAST_BACKEND, f"{self.why}; precision fast: {found.reason}"


def describe(verdict: Verdict | None, asked: str) -> dict[str, Any]:
    """The infer asset's metadata about precision (per partition when fast was asked)."""
    if asked == "exact":
        return {"precision": "exact"}
    if verdict is None:
        return {"precision": "fast (decided per partition)"}
    out: dict[str, Any] = {"precision": f"fast ({FAST_PRECISION})" if verdict.usable else "exact (fast refused)",
                           "precision_reason": verdict.reason}
    if verdict.recall_at_10 is not None:
        out.update(precision_recall_at_10=verdict.recall_at_10,
                   precision_recall_at_10_partition=verdict.recall_at_size,
                   precision_recall_lower_bound=verdict.recall_low,
                   precision_min_cosine=verdict.min_cosine, precision_mean_cosine=verdict.mean_cosine)
    if verdict.probe_texts:
        out["precision_probe_texts"] = verdict.probe_texts
    return out


def load(encoder: Any, backend: str, why: str, pinned: str) -> FastMode:
    """The fast mode over what the exact choice loaded; refused at once (for every partition) where it cannot run:
    a pinned torch/onnx backend is a load error, a model not on OpenVINO or a CPU without bf16 keeps exact."""
    if pinned in ("torch", "onnx"):
        raise ValueError(f"precision 'fast' runs the OpenVINO export, but model.config.backend pins {pinned!r}: set "
                         "backend to auto or openvino, or precision to exact")
    refused = None
    if not isinstance(encoder, ExportedEncoder) or encoder.backend != FAST_RUNTIME:
        refused = Verdict(False, f"fast runs the OpenVINO export; this model runs with {backend} ({why}): exact used")
    elif not cpu_has_bf16():
        refused = Verdict(False, "this CPU has no bfloat16 (AMX or AVX512-BF16): nothing to gain, exact used")
    return FastMode(encoder, backend, why, refused)
