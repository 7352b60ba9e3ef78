"""The infer loop alone, before/after: the infer step of one partition against the model called directly.

    python bench/infer_loop.py embed --repo /path/to/checkout --rows 10000 --repeat 3
    python bench/infer_loop.py api   --repo /path/to/checkout --requests 2000 --latency 0.25 --in-flight 64
    python bench/infer_loop.py api   --base-url http://127.0.0.1:8765 --requests 1000 --in-flight 1000

`--repo` picks the checkout whose `batch_assets` is measured (run it once on the old commit, once on the new: the
stage functions `run_read` / `run_prepare` / `run_infer` have the same signature in both).
- embed: all-MiniLM-L6-v2 on CPU over N short documents. `raw` is one `encode` call over every text (what a hand
  script does; sentence-transformers sorts the call by length), `infer` is `run_infer` on the prepared partition
  with the same loaded model. Interleaved, median of --repeat.
- api: a loopback OpenAI-compatible server (tests/resources/openai_api/fault_proxy.py answering by itself after --latency s, or
  with --base-url a running bench/api_server.py, whose CPU is then not this process's); requests/s of `run_infer`
  over a generate partition against the ideal in-flight / latency, and the process's CPU per request (the client's
  cost, with --base-url). `make bench`'s api section runs it with --base-url.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the quick brown fox jumps over a lazy dog while rain falls on quiet streets of the old harbour town "
         "and markets open early with bread fish fruit coffee news and music").split()


def _docs(n: int) -> list[dict]:
    import random

    rng = random.Random(0)
    return [{"doc_id": f"d{i}", "text": " ".join(rng.choices(WORDS, k=rng.randint(6, 18)))} for i in range(n)]


def _setup(repo: Path, rows: list[dict], spec_changes: dict):
    sys.path.insert(0, str(repo))
    from batch_assets.spec import parse_spec
    from batch_assets.stages.prepare import run_prepare
    from batch_assets.stages.read import run_read
    from batch_assets.storage import ArrowStorage

    tmp = Path(tempfile.mkdtemp(prefix="bench-infer-"))
    (tmp / "data").mkdir()
    (tmp / "data" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = {
        "name": "bench",
        "source": {"format": "jsonl", "path": f"{tmp}/data/{{partition}}.jsonl", "columns": ["doc_id", "text"]},
        "partitioning": {"kind": "static", "keys": ["a"]},
        "prepare": {"id_column": "doc_id", "text_column": "text"},
        "task": {"kind": "embed"},
        "model": {"provider": "sentence_transformers", "config": {}},
        **spec_changes,
    }
    spec = parse_spec(raw)
    storage = ArrowStorage(root=str(tmp / "store"))
    run_read(spec, storage, "a")
    run_prepare(spec, storage, "a")
    return spec, storage


def _infer_once(spec, storage) -> float:
    from batch_assets.stages.infer import InferStats, run_infer

    provider = _infer_once.provider  # type: ignore[attr-defined]
    start, cpu = time.perf_counter(), time.process_time()
    run_infer(spec, storage, "a", provider, InferStats())
    elapsed = time.perf_counter() - start
    _infer_once.cpu = time.process_time() - cpu  # type: ignore[attr-defined]
    from batch_assets.storage import filesystem_for  # noqa: F401  (same checkout)

    staging = Path(storage.resolved_root()) / spec.name / "_staging"
    if staging.exists():  # a new run must not resume from the previous repetition's checkpoint
        import shutil

        shutil.rmtree(staging)
    return elapsed


def bench_embed(args) -> dict:
    rows = _docs(args.rows)
    spec, storage = _setup(args.repo, rows, {})
    from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder

    provider = SentenceTransformerEmbedder(batch_size=32, device="cpu").load_for_tests()
    _infer_once.provider = provider  # type: ignore[attr-defined]
    texts = [r["text"] for r in rows]
    provider.embed(texts[:256])  # warm-up
    raw, infer, raw_cpu, infer_cpu = [], [], [], []
    for _ in range(args.repeat):
        start, cpu = time.perf_counter(), time.process_time()
        provider.embed(texts)
        raw.append(time.perf_counter() - start)
        raw_cpu.append(time.process_time() - cpu)
        infer.append(_infer_once(spec, storage))
        infer_cpu.append(_infer_once.cpu)  # type: ignore[attr-defined]
    r, i = statistics.median(raw), statistics.median(infer)
    rc, ic = statistics.median(raw_cpu), statistics.median(infer_cpu)
    return {"variant": "embed", "repo": str(args.repo), "rows": args.rows, "chunk_rows": spec.runtime.chunk_rows,
            "raw_encode_s": round(r, 2), "infer_step_s": round(i, 2), "infer_over_raw_speed": round(r / i, 3),
            "raw_runs": [round(x, 2) for x in raw], "infer_runs": [round(x, 2) for x in infer],
            # CPU seconds of the whole process (all threads): less sensitive to other load than wall time
            "raw_cpu_s": round(rc, 2), "infer_cpu_s": round(ic, 2), "infer_over_raw_cpu": round(rc / ic, 3),
            "load_avg_1m": round(__import__("os").getloadavg()[0], 1)}


def bench_api(args) -> dict:
    if args.base_url:  # an external server (bench/api_server.py): this process's CPU is then the client's alone
        return _api_runs(args, args.base_url.rstrip("/") + "/v1", None)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the proxy from this checkout's tests
    from tests.resources.openai_api.fault_proxy import Echo, FaultProxy

    with FaultProxy(lambda key, n: Echo(delay_s=args.latency)) as proxy:
        proxy._server.request_queue_size = 1024
        return _api_runs(args, proxy.url, proxy)


def _api_runs(args, url: str, proxy) -> dict:
    rows = [{"doc_id": f"q{i}", "text": f"question {i}"} for i in range(args.requests)]
    spec, storage = _setup(args.repo, rows, {
        "prepare": {"id_column": "doc_id", "template": "{text}"},
        "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
        "model": {"provider": "openai", "config": {"model": "m", "base_url": url, "max_concurrency": args.in_flight}},
    })
    from batch_assets.resources.openai_api import OpenAICompatibleProvider

    provider = OpenAICompatibleProvider(model="m", base_url=url, max_concurrency=args.in_flight).load_for_tests()
    _infer_once.provider = provider  # type: ignore[attr-defined]
    _infer_once(spec, storage)  # warm-up: connections opened, code paths loaded
    runs, cpus = [], []
    for _ in range(args.repeat):
        runs.append(_infer_once(spec, storage))
        cpus.append(_infer_once.cpu)  # type: ignore[attr-defined]
    provider.close()
    seconds = statistics.median(runs)
    ideal = args.in_flight / args.latency
    out = {"variant": "api", "repo": str(args.repo), "requests": args.requests, "latency_s": args.latency,
           "in_flight": args.in_flight, "chunk_rows": spec.runtime.chunk_rows,
           "req_per_s": round(args.requests / seconds, 1), "ideal_req_per_s": ideal,
           "of_ideal": round(args.requests / seconds / ideal, 3), "runs_s": [round(x, 2) for x in runs],
           # the whole process's CPU (every thread) during the infer step, per request: the client's cost
           "cpu_ms_per_request": round(1000 * statistics.median(cpus) / args.requests, 3),
           "load_avg_1m": round(__import__("os").getloadavg()[0], 1)}
    if proxy is not None:
        last = [a for a in proxy.attempts][-args.requests:]  # the last repetition's requests
        span = max(a.finished for a in last) - min(a.arrived for a in last)
        busy = sum(a.finished - a.arrived for a in last)
        # what the server saw: requests in flight on average between the first arrival and the last answer, and
        # the latency it really gave (a loaded machine answers later than --latency)
        out.update(max_in_flight_seen=proxy.max_in_flight, mean_in_flight_at_server=round(busy / span, 1),
                   mean_server_latency_s=round(busy / len(last), 3), server_span_s=round(span, 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=["embed", "api"])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=0.25)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--base-url", default=None,
                        help="api: a running bench/api_server.py (http://127.0.0.1:PORT) instead of the in-process proxy")
    args = parser.parse_args()
    args.repo = args.repo.resolve()
    print(json.dumps(bench_embed(args) if args.variant == "embed" else bench_api(args)))


if __name__ == "__main__":
    main()
