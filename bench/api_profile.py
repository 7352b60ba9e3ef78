"""Where the API client's CPU goes, per request: the OpenAI-compatible provider against bench/api_server.py (started
here, in its own process, so this process's CPU is the client's alone), each thread's CPU apart, and optionally a
cProfile of the provider's event-loop thread.

    .venv/bin/python bench/api_profile.py --requests 4000 --in-flight 1000 --what provider [--profile 25]
    .venv/bin/python bench/api_profile.py --requests 4000 --in-flight 1000 --what infer

- provider: `provider.generate` over every request in one call (the HTTP path, the gate, retries' bookkeeping);
- infer: `run_infer` on a prepared partition (the above plus chunks, the answer journal, checkpoints, the file),
  what bench/infer_loop.py api measures.
Prints one JSON line: requests/s, ÷ ideal (in flight ÷ latency), CPU ms per request for the whole process and per
thread (the loop thread is `openai-provider-loop`), and the load average beside it; with --profile N the N
functions with the most own time on the loop thread go to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread of this process, by name (Linux: each thread's own CPU clock)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            clock = time.pthread_getcpuclockid(t.ident)
            out[t.name] = out.get(t.name, 0.0) + time.clock_gettime(clock)
        except (OSError, TypeError, AttributeError):
            continue
    return out


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(BENCH / "api_server.py"), "--port", str(port), "--latency",
                             str(latency)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/stats", timeout=2).read()
            return proc, base
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("bench/api_server.py did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--in-flight", type=int, default=1000)
    ap.add_argument("--latency", type=float, default=0.25)
    ap.add_argument("--what", choices=["provider", "infer"], default="provider")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, help="print the N functions with most own time (loop thread)")
    ap.add_argument("--gc", choices=["default", "freeze", "off", "threshold"], default="default",
                    help="the garbage collector while measuring: as the product leaves it, frozen after load, or off")
    ap.add_argument("--uvloop", action="store_true", help="the provider's loop is uvloop's (an experiment)")
    ap.add_argument("--repo", type=Path, default=BENCH.parent,
                    help="the checkout whose batch_assets is measured (an older one: before/after)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.repo.resolve()))

    from batch_assets.resources.openai_api import OpenAICompatibleProvider
    from batch_assets.resources.protocols import GenerationParams

    if args.uvloop:
        import asyncio

        import uvloop

        asyncio.new_event_loop = uvloop.new_event_loop  # what BackgroundLoop calls
    server, base = start_server(args.latency)
    try:
        url = base + "/v1"
        provider = OpenAICompatibleProvider(model="bench", base_url=url, max_concurrency=args.in_flight)
        provider = provider.load_for_tests()
        loop = provider.loaded.runner.loop
        if args.what == "infer":
            import infer_loop

            rows = [{"doc_id": f"q{i}", "text": f"question {i}"} for i in range(args.requests)]
            spec, storage = infer_loop._setup(args.repo.resolve(), rows, {
                "prepare": {"id_column": "doc_id", "template": "{text}"},
                "task": {"kind": "generate", "params": {"max_new_tokens": 4}},
                "model": {"provider": "openai", "config": {"model": "bench", "base_url": url,
                                                           "max_concurrency": args.in_flight}},
            })
            infer_loop._infer_once.provider = provider

            def once() -> None:
                infer_loop._infer_once(spec, storage)
        else:
            conversations = [[{"role": "user", "content": f"question {i}"}] for i in range(args.requests)]
            params = GenerationParams(max_new_tokens=4)

            def once() -> None:
                results = provider.generate(conversations, params)
                assert len(results) == args.requests and all(r.error is None for r in results)

        once()  # warm-up: connections opened, code paths loaded
        import gc

        if args.gc == "freeze":
            gc.freeze()
        elif args.gc == "off":
            gc.disable()
        elif args.gc == "threshold":
            gc.set_threshold(50_000, 20, 10)
        profiler = cProfile.Profile() if args.profile else None
        walls, cpus, threads = [], [], []
        for r in range(args.repeat):
            if profiler is not None and r == args.repeat - 1:  # the last repetition only, on the loop's thread
                loop.call_soon_threadsafe(profiler.enable)
                time.sleep(0.05)
            before_threads, before_cpu, start = thread_cpu(), time.process_time(), time.perf_counter()
            once()
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - before_cpu)
            after = thread_cpu()
            threads.append({k: after[k] - before_threads.get(k, 0.0) for k in after})
            if profiler is not None and r == args.repeat - 1:
                done = threading.Event()
                loop.call_soon_threadsafe(lambda: (profiler.disable(), done.set()))
                done.wait(5)
        provider.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
    # the repetition with the median CPU (its wall time and threads with it): one lucky or loaded run moves neither
    best = sorted(range(len(cpus)), key=lambda i: cpus[i])[len(cpus) // 2]
    ideal = args.in_flight / args.latency
    per_thread: dict[str, float] = {}
    for name, secs in threads[best].items():
        key = "loop" if name.startswith("openai-provider-loop") else name.split("-")[0].split("_")[0]
        per_thread[key] = round(per_thread.get(key, 0.0) + 1000 * secs / args.requests, 3)
    from batch_assets.resources.openai_api import provider as provider_module

    print(json.dumps({
        "what": args.what, "code": str(Path(provider_module.__file__).parents[2]), "gc": args.gc, "uvloop": args.uvloop,
        "requests": args.requests,
        "in_flight": args.in_flight, "latency_s": args.latency,
        "req_per_s": round(args.requests / walls[best], 1),
        "of_ideal": round(args.requests / walls[best] / ideal, 3),
        "cpu_ms_per_request": round(1000 * cpus[best] / args.requests, 3),
        "cpu_ms_per_request_runs": [round(1000 * c / args.requests, 3) for c in cpus],
        "thread_cpu_ms_per_request": per_thread, "load_avg_1m": round(os.getloadavg()[0], 2),
    }))
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stderr)
        stats.sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
