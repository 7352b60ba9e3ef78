"""The infer stage: hand chunks of prepared rows to the model provider and attach its outputs.

Rows flagged empty in preparation are not sent; they get a row error. Row-level provider failures (a request
that exhausted its retries, output that failed validation) also become row errors, and the partition goes on.
A failure of the provider as a whole (model crash, bad configuration) fails the step: nothing is committed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from batch_assets.errors import PipelineError
from batch_assets.report import PartitionReport
from batch_assets.spec import PipelineSpec
from batch_assets.storage import ArrowStorage, read_batches, upstream_url, write_parquet
from resources.protocols import Generation, GenerationParams


@dataclass
class InferStats:
    rows_in: int = 0
    rows_out: int = 0
    rows_with_errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_samples: list[str] = field(default_factory=list)

    def note_errors(self, ids: list[str], errors: list[str | None]) -> None:
        for row_id, err in zip(ids, errors):
            if err is not None:
                self.rows_with_errors += 1
                if len(self.error_samples) < 5:
                    self.error_samples.append(f"{row_id}: {err}")


def run_infer(spec: PipelineSpec, storage: ArrowStorage, key: str, provider: Any, stats: InferStats) -> PartitionReport:
    """The infer stage for one partition: `prepared` rows in chunks of `runtime.chunk_rows` to the model,
    `inferred` rows (inputs, outputs, `error`) out. `stats` accumulates over every partition of the run."""
    import time

    start = time.perf_counter()
    before = (stats.rows_out, stats.rows_with_errors)
    src = upstream_url(storage, spec.name, "prepared", key)
    url = storage.stage_url(spec.name, "inferred", key)
    with write_parquet(url) as writer:
        chunks = read_batches(src, batch_rows=spec.runtime.chunk_rows)
        for batch in infer_batches(spec, provider, chunks, stats):
            writer.write(batch)
    rows = stats.rows_out - before[0]
    return PartitionReport(key, rows, rows, time.perf_counter() - start, url,
                           {"rows_with_errors": stats.rows_with_errors - before[1]})


def generation_params(spec: PipelineSpec) -> GenerationParams:
    p = spec.task.params
    constraints = spec.task.structured.generation_constraints() if spec.task.structured else {}
    return GenerationParams(
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature,
        top_p=p.top_p,
        stop=tuple(p.stop),
        seed=p.seed,
        **constraints,
    )


def normalize_label(text: str | None, labels: list[str], default: str) -> str:
    """Map free text to one of `labels`: an exact match (ignoring case and punctuation), else the label that
    appears first in the text, else `default`."""
    if not text:
        return default
    squash = lambda s: re.sub(r"[^a-z0-9]+", " ", s.lower()).strip()  # noqa: E731
    answer = squash(text)
    by_norm = {squash(label): label for label in labels}
    if answer in by_norm:
        return by_norm[answer]
    best: tuple[int, str] | None = None
    for norm, label in by_norm.items():
        m = re.search(rf"\b{re.escape(norm)}\b", answer)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), label)
    return best[1] if best else default


def infer_batches(
    spec: PipelineSpec, provider: Any, batches: Iterator[pa.RecordBatch], stats: InferStats
) -> Iterator[pa.RecordBatch]:
    handler = {
        "generate": _generate,
        "embed": _embed,
        "classify": _classify,
        "predict": _predict,
        "embed_image": _embed_image,
        "classify_image": _classify_image,
    }[spec.task.kind]
    params = generation_params(spec) if spec.task.kind == "generate" else None
    for batch in batches:
        stats.rows_in += batch.num_rows
        empty = batch.column("_input_empty").to_pylist()
        problems = batch.column("_input_problem").to_pylist()
        live = [i for i, e in enumerate(empty) if not e]
        errors: list[str | None] = list(problems)
        names, arrays = handler(spec, provider, batch, live, errors, stats, params)
        stats.note_errors(batch.column("row_id").to_pylist(), errors)
        stats.rows_out += batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, *arrays, pa.array(errors, pa.string())],
            names=[*batch.schema.names, *names, "error"],
        )


def _scatter(values: list[Any], live: list[int], n: int) -> list[Any]:
    out: list[Any] = [None] * n
    for i, v in zip(live, values):
        out[i] = v
    return out


def _generate(spec, provider, batch, live, errors, stats, params):
    prompts = batch.column("_prompt").to_pylist()
    images = batch.column("_images").to_pylist() if "_images" in batch.schema.names else None
    conversations = []
    for i in live:
        messages = [{"role": "system", "content": spec.prepare.system}] if spec.prepare.system else []
        content: Any = prompts[i]
        if images is not None and images[i]:
            from resources.multimodal import build_user_content

            content = build_user_content(prompts[i], images[i])
        messages.append({"role": "user", "content": content})
        conversations.append(messages)
    results: list[Generation] = provider.generate(conversations, params) if conversations else []
    if len(results) != len(conversations):
        raise RuntimeError(
            f"{type(provider).__name__}.generate returned {len(results)} results for {len(conversations)} prompts"
        )
    n = batch.num_rows
    texts = _scatter([r.text for r in results], live, n)
    for i, r in zip(live, results):
        if r.error:
            errors[i] = r.error
    p_tok = _scatter([r.prompt_tokens for r in results], live, n)
    c_tok = _scatter([r.completion_tokens for r in results], live, n)
    stats.prompt_tokens += sum(t or 0 for t in p_tok)
    stats.completion_tokens += sum(t or 0 for t in c_tok)
    names = [spec.task.resolved_output_column(), "prompt_tokens", "completion_tokens"]
    arrays = [pa.array(texts, pa.string()), pa.array(p_tok, pa.int64()), pa.array(c_tok, pa.int64())]
    task = spec.task
    if task.structured:
        from batch_assets.structured_columns import structured_columns

        s_names, s_arrays = structured_columns(spec, texts, errors)
        names += s_names
        arrays += s_arrays
    if task.labels:
        labels = [
            normalize_label(t, task.labels, task.default_label) if errors[i] is None else None
            for i, t in enumerate(texts)
        ]
        names.append(task.label_column)
        arrays.append(pa.array(labels, pa.string()))
    return names, arrays


def _vectors_column(vectors: np.ndarray | None, live: list[int], n: int) -> pa.Array:
    dim = int(vectors.shape[1]) if vectors is not None and vectors.size else 0
    type_ = pa.list_(pa.float32(), dim) if dim else pa.list_(pa.float32())
    rows = _scatter(list(vectors) if vectors is not None else [], live, n)
    return pa.array([None if r is None else np.asarray(r, dtype=np.float32) for r in rows], type_)


def _embed(spec, provider, batch, live, errors, stats, params):
    texts = batch.column("_text").to_pylist()
    vectors = provider.embed([texts[i] for i in live]) if live else None
    if vectors is not None and len(vectors) != len(live):
        raise RuntimeError(f"{type(provider).__name__}.embed returned {len(vectors)} vectors for {len(live)} texts")
    return [spec.task.resolved_output_column()], [_vectors_column(vectors, live, batch.num_rows)]


def _classification_columns(spec, results, live, errors, n):
    for i, r in zip(live, results):
        if r.error:
            errors[i] = r.error
    labels = _scatter([r.label for r in results], live, n)
    scores = _scatter([r.score for r in results], live, n)
    return [spec.task.resolved_output_column(), "score"], [pa.array(labels, pa.string()), pa.array(scores, pa.float64())]


def _classify(spec, provider, batch, live, errors, stats, params):
    texts = batch.column("_text").to_pylist()
    results = provider.classify([texts[i] for i in live], spec.task.labels) if live else []
    return _classification_columns(spec, results, live, errors, batch.num_rows)


def _predict(spec, provider, batch, live, errors, stats, params):
    columns = spec.prepare.input_columns or spec.source.columns
    inputs = {}
    for c in columns:
        values = batch.column(c).to_pylist()
        inputs[c] = [values[i] for i in live]
    out = provider.predict(inputs) if live else []
    n = batch.num_rows
    outputs = out if isinstance(out, dict) else {spec.task.resolved_output_column(): out}
    clash = sorted(set(outputs) & set(batch.schema.names))
    if clash:
        raise PipelineError(
            f"the model returned column(s) {clash}, which the input already has",
            column=clash[0],
            fix="rename the model's output keys, or set task.output_column",
        )
    return list(outputs), [pa.array(_scatter(list(v), live, n)) for v in outputs.values()]


def _load_images(spec, batch, live, errors):
    from resources.multimodal import load_image

    refs = batch.column(spec.prepare.image_columns[0]).to_pylist()
    images, ok = [], []
    for i in live:
        try:
            images.append(load_image(refs[i], max_side=spec.prepare.image_max_side))
            ok.append(i)
        except Exception as exc:  # a bad image is that row's error, not the partition's
            errors[i] = f"image could not be read: {exc}"
    return images, ok


def _embed_image(spec, provider, batch, live, errors, stats, params):
    images, ok = _load_images(spec, batch, live, errors)
    vectors = provider.embed_images(images) if images else None
    return [spec.task.resolved_output_column()], [_vectors_column(vectors, ok, batch.num_rows)]


def _classify_image(spec, provider, batch, live, errors, stats, params):
    images, ok = _load_images(spec, batch, live, errors)
    results = provider.classify_images(images, spec.task.labels) if images else []
    return _classification_columns(spec, results, ok, errors, batch.num_rows)
