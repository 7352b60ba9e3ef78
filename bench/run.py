"""`make bench`: every variant of every job as a whole process, interleaved and repeated, in one run.

Sections (BENCH_SECTIONS, comma-separated; default all): embed, api, orchestration, generate, memory, start,
transcribe (BENCH_SPEECH_COPIES: renditions of the speech corpus's 24 sentences).
Sizes: BENCH_PROFILE=quick (default) | full (the issue's sizes) | tiny (smoke test), and
BENCH_DOCS, BENCH_PROMPTS, BENCH_API_REQUESTS, BENCH_API_LATENCY, BENCH_REPEATS, ... (bench/common.py).
BENCH_PEERS=0 skips Daft and Ray (no peers virtualenv needed).

Writes bench/results/<section>.json and the results table of docs/BENCHMARKS.md (between its bench markers).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ours  # noqa: E402
from common import (  # noqa: E402
    BENCH, OUR_PY, PEERS_PY, RESULTS, ROOT, WORK, Knobs, Run, log, machine, run_process, summary, versions,
    write_json,
)
from data import write_documents, write_prompts  # noqa: E402
from report import RAW_EMBED, steady_state_overhead, write_doc  # noqa: E402

Variant = Callable[[int], Run]
OURS = "ours (dagster asset materialize)"
OURS_FAST = "ours, precision fast (dagster asset materialize)"
RAW_GENERATE = "raw batched generate"
DAFT_API = "Daft prompt (openai provider)"
RAY_API = "Ray Data LLM HttpRequestProcessor (defaults)"
PHASES = ("phase_cli_start_and_definitions_s", "phase_resource_init_s", "phase_step_raw_s", "phase_step_prepared_s",
          "phase_step_inferred_s", "phase_step_output_s", "phase_exit_s")


def interleave(variants: dict[str, Variant], repeats: int) -> dict[str, list[Run]]:
    """Run every variant `repeats` times, rotating the order each round so drift hits all of them alike."""
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            log(f"  round {r + 1}/{repeats}: {name}")
            run = variants[name](r)
            status = "ok" if run.rc == 0 else f"FAILED rc={run.rc} (log {run.log_path})"
            log(f"    {run.wall_s:.1f}s, peak RSS {run.peak_rss_mb:.0f} MB, {status}")
            runs[name].append(run)
    return runs


def describe(runs: dict[str, list[Run]], extra_fields: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r.rc == 0]
        entry: dict[str, Any] = {"wall_s": summary([r.wall_s for r in ok]), "failed_runs": len(rs) - len(ok),
                                 "peak_rss_mb": summary([r.peak_rss_mb for r in ok])}
        if len(ok) < len(rs):
            entry["error_tail"] = next(r.log_tail[-1500:] for r in rs if r.rc != 0)
        for f in extra_fields:
            values = [float(r.result[f]) for r in ok if r.result.get(f) is not None]
            if values:
                entry[f] = summary(values)
        out[name] = entry
    return out


def med(section: dict[str, Any], name: str, field: str = "wall_s") -> float | None:
    value = section.get(name, {}).get(field, {})
    return value.get("median") if value else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def peers_ready(knobs: Knobs) -> bool:
    return knobs.peers and PEERS_PY.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- embeddings ---------------------------------------------------------------------------------------------------
def bench_embed(knobs: Knobs) -> dict[str, Any]:
    data = WORK / "data" / f"docs-{knobs.docs}"
    write_documents(data, knobs.docs)
    glob = str(data / "*.parquet")
    out = WORK / "out"
    spec = ours.embed_spec("bench_embed", data, ours.KEYS)
    variants = _raw_and_ours(RAW_EMBED, "raw_embed", glob, spec)
    # the declared fast mode (bf16 where the CPU has it and the retrieval probe passes: resources/hf/precision.py)
    fast = ours.embed_spec("bench_embed_fast", data, ours.KEYS, precision="fast")
    variants[OURS_FAST] = lambda r: ours.materialize(fast, ours.KEYS, label=f"-{r}")
    if ours.before_tree():
        variants[f"ours before ({ours.before_label()})"] = lambda r: ours.materialize(
            spec, ours.KEYS, label=f"-{r}", tree=ours.before_tree())
    if peers_ready(knobs):
        variants["Daft embed_text"] = lambda r: _peer("daft_embed.py", ["--input", glob, "--output",
                                                                         _fresh(out / "daft_embed")], f"daft-embed-{r}")
        variants["Ray Data map_batches"] = lambda r: _peer("ray_embed.py", ["--input", glob, "--output",
                                                                              _fresh(out / "ray_embed")], f"ray-embed-{r}")
    runs = interleave(variants, knobs.repeats_for("embed"))
    res = describe(runs, ("infer_s", "inferred_s", "load_s", "import_s", "read_s", "write_s", "model_loads",
                          "partitions_fast", *PHASES))
    raw = med(res, RAW_EMBED)
    mine = med(res, OURS)
    peers = [m for m in (med(res, "Daft embed_text"), med(res, "Ray Data map_batches")) if m]
    ratios = {
        "ours_vs_raw_whole_process": ratio(raw, mine),
        "ours_infer_step_vs_raw_encode": ratio(med(res, RAW_EMBED, "infer_s"), med(res, OURS, "inferred_s")),
        "ours_vs_faster_peer": ratio(min(peers), mine) if peers else None,
        "ours_fast_vs_raw_whole_process": ratio(raw, med(res, OURS_FAST)),
    }
    _add_speed_vs_raw(res, raw)
    fidelity = _fast_fidelity(out)
    ratios["fast_recall_at_10_vs_raw"] = fidelity.get("recall_at_10")
    # of the 4 partitions, how many the probe let run fast (the others ran exact: resources/hf/precision.py)
    ratios["fast_partitions_of_4"] = med(res, OURS_FAST, "partitions_fast")
    return {"rows": knobs.docs, "files": 4, "repeats": knobs.repeats_for("embed"), "variants": res, "ratios": ratios,
            "fast_fidelity": fidelity}


def _fast_fidelity(out: Path) -> dict[str, Any]:
    """The fast mode's vectors against the raw script's (torch, float32) on the benchmark's documents: recall@10
    and cosines (bench/fidelity.py), from the last round's outputs."""
    import fidelity

    try:
        return fidelity.compare(*fidelity.vectors(str(out / "raw_embed.parquet"), "doc_id"),
                                *fidelity.vectors(str(out / "bench_embed_fast" / "**" / "*.parquet"), "doc_id"))
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def _raw_and_ours(raw_name: str, script: str, glob: str, spec: dict[str, Any]) -> dict[str, Variant]:
    """The pair every local-model section starts from: the hand-written script over the same files, and our
    pipeline's materialization."""
    return {
        raw_name: lambda r: run_process(
            [str(OUR_PY), str(BENCH / f"{script}.py"), "--input", glob, "--output",
             str(WORK / "out" / f"{script}.parquet")], log=WORK / "logs" / f"{script.replace('_', '-')}-{r}.log"),
        OURS: lambda r: ours.materialize(spec, ours.KEYS, label=f"-{r}"),
    }


def _add_speed_vs_raw(res: dict[str, Any], raw: float | None) -> None:
    for name in res:
        res[name]["speed_vs_raw"] = ratio(raw, med(res, name))


def _fresh(path: Path) -> str:
    shutil.rmtree(path, ignore_errors=True)
    return str(path)


def _peer(script: str, args: list[str], label: str, timeout: float = 1800) -> Run:
    return run_process([str(PEERS_PY), str(BENCH / "peers" / script), *args], log=WORK / "logs" / f"{label}.log",
                       env={"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0", "DAFT_PROGRESS_BAR": "0"},
                       timeout=timeout)


# -- local generation ---------------------------------------------------------------------------------------------
def bench_generate(knobs: Knobs) -> dict[str, Any]:
    data = WORK / "data" / f"prompts-{knobs.prompts}"
    write_prompts(data, knobs.prompts)
    glob = str(data / "*.parquet")
    out = WORK / "out"
    spec = ours.generate_spec("bench_generate", data, ours.KEYS)
    variants = _raw_and_ours(RAW_GENERATE, "raw_generate", glob, spec)
    if peers_ready(knobs) and os.environ.get("BENCH_DAFT_GENERATE", "1") == "1":
        model_dir = str(WORK / "smollm2-transformers")
        _peer("daft_generate.py", ["--input", "-", "--output", "-", "--model-dir", model_dir, "--convert"],
              "daft-generate-convert")
        variants["Daft prompt (transformers)"] = lambda r: _peer(
            "daft_generate.py", ["--input", glob, "--output", _fresh(out / "daft_generate"), "--model-dir", model_dir],
            f"daft-generate-{r}", timeout=float(os.environ.get("BENCH_PEER_TIMEOUT", 900)))
    runs = interleave(variants, knobs.repeats_for("generate"))
    res = describe(runs, ("infer_s", "inferred_s", "load_s", "import_s", "model_loads", *PHASES))
    raw = med(res, RAW_GENERATE)
    _add_speed_vs_raw(res, raw)
    ratios = {
        "ours_vs_raw_whole_process": ratio(raw, med(res, OURS)),
        "ours_infer_step_vs_raw_generate": ratio(med(res, RAW_GENERATE, "infer_s"), med(res, OURS, "inferred_s")),
    }
    return {"rows": knobs.prompts, "max_new_tokens": 16, "repeats": knobs.repeats_for("generate"), "variants": res, "ratios": ratios}


# -- API path -----------------------------------------------------------------------------------------------------
class ApiServer:
    def __init__(self, latency: float) -> None:
        self.port = free_port()
        self.latency = latency
        log_file = open(WORK / "logs" / "api-server.log", "w")
        self.proc = subprocess.Popen([str(OUR_PY), str(BENCH / "api_server.py"), "--port", str(self.port),
                                      "--latency", str(latency)], stdout=log_file, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(300):
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the benchmark API server did not start; see bench/work/logs/api-server.log")

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/stats", timeout=5) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.base + "/reset", method="POST"), timeout=5).read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def bench_api(knobs: Knobs) -> dict[str, Any]:
    """Ours at `api_in_flight` (64: against the ideal in flight ÷ latency) and at `api_wide_in_flight` (1,000: beside
    Daft's `prompt`, which sends every request at once), Daft and Ray Data, interleaved; then the client's CPU per
    request (bench/infer_loop.py api: the infer step alone against the same server, ours and BENCH_BEFORE_TREE's)."""
    data = WORK / "data" / f"prompts-{knobs.api_requests}"
    write_prompts(data, knobs.api_requests)
    glob = str(data / "*.parquet")
    out = WORK / "out"
    server = ApiServer(knobs.api_latency)
    narrow, wide = knobs.api_in_flight, knobs.api_wide_in_flight
    specs = {n: ours.api_spec(f"bench_api_{n}", data, ours.KEYS, n) for n in (narrow, wide)}
    env = {"BENCH_OPENAI_BASE_URL": server.base + "/v1", "BENCH_OPENAI_KEY": "bench"}

    def measured(fn: Callable[[], Run]) -> Variant:
        def go(_r: int) -> Run:
            server.reset()
            run = fn()
            stats = server.stats()
            run.result.update(requests=stats["served"], max_in_flight=stats["max_in_flight"],
                              requests_per_s=stats["served"] / stats["window_s"] if stats["window_s"] else None,
                              cpu_s=run.cpu_s)
            if run.rc == 0 and stats["served"] < knobs.api_requests:
                run.rc = 99  # a variant that did not send every request has not done the job
                run.log_tail += f"\nonly {stats['served']} of {knobs.api_requests} requests reached the server"
            return run
        return go

    def ours_at(n: int, tree: Path | None = None) -> Variant:
        return measured(lambda: ours.materialize(specs[n], ours.KEYS, env=env, tree=tree))

    variants: dict[str, Variant] = {f"ours ({n} in flight)": ours_at(n) for n in (narrow, wide)}
    if ours.before_tree():
        variants.update({f"ours before ({ours.before_label()}, {n} in flight)": ours_at(n, ours.before_tree())
                         for n in (narrow, wide)})
    if peers_ready(knobs) and os.environ.get("BENCH_API_DAFT", "1") == "1":
        variants[DAFT_API] = measured(lambda: _peer(
            "daft_api.py", ["--input", glob, "--output", _fresh(out / "daft_api"), "--base-url", server.base + "/v1"],
            "daft-api", timeout=float(os.environ.get("BENCH_PEER_TIMEOUT", 900))))
    if peers_ready(knobs) and os.environ.get("BENCH_API_RAY", "1") == "1":  # 15 req/s: minutes at 4,000 requests
        variants[RAY_API] = measured(lambda: _peer(
            "ray_api.py", ["--input", glob, "--output", _fresh(out / "ray_api"), "--url",
                           server.base + "/v1/chat/completions"], "ray-api",
            timeout=float(os.environ.get("BENCH_PEER_TIMEOUT", 900))))
    try:
        runs = interleave(variants, knobs.repeats_for("api"))
        client_cpu = {label: _client_cpu(server, knobs, wide, tree)
                      for label, tree in [("ours", None)] + ([(f"before ({ours.before_label()})", ours.before_tree())]
                                                            if ours.before_tree() else [])}
    finally:
        server.close()
    res = describe(runs, ("requests_per_s", "max_in_flight", "requests", "inferred_s", "cpu_s"))
    ideal = narrow / knobs.api_latency
    for name in res:
        res[name]["vs_ideal"] = ratio(med(res, name, "requests_per_s"), ideal) if f"({narrow} in" in name else None
    mine, mine_wide = (f"ours ({n} in flight)" for n in (narrow, wide))
    rate = med(res, mine, "requests_per_s")
    peer_rates = {n: med(res, n, "requests_per_s") for n in (DAFT_API, RAY_API) if n in res}
    ratios = {"ours_vs_ideal": ratio(rate, ideal),
              "ours_wide_vs_ideal": ratio(med(res, mine_wide, "requests_per_s"), wide / knobs.api_latency),
              **{f"ours_vs_{n}": ratio(rate, v) for n, v in peer_rates.items() if v},
              # P4b: ours at 1,000 in flight beside Daft, which had them all in flight at once
              "ours_wide_vs_daft_request_phase": ratio(med(res, mine_wide, "requests_per_s"), peer_rates.get(DAFT_API)),
              "ours_wide_vs_daft_whole_process": ratio(med(res, DAFT_API), med(res, mine_wide)),
              "client_cpu_ms_per_request": client_cpu["ours"].get("cpu_ms_per_request")}
    return {"requests": knobs.api_requests, "latency_s": knobs.api_latency, "in_flight": narrow,
            "wide_in_flight": wide, "ideal_requests_per_s": ideal, "repeats": knobs.repeats_for("api"),
            "variants": res, "client_cpu": client_cpu, "ratios": ratios}


def _client_cpu(server: ApiServer, knobs: Knobs, in_flight: int, tree: Path | None) -> dict[str, Any]:
    """CPU seconds per request of the infer step alone (read and prepare done before; no Dagster), median of 3
    repeats, from bench/infer_loop.py in its own process against the benchmark server."""
    cmd = [str(OUR_PY), str(BENCH / "infer_loop.py"), "api", "--base-url", server.base, "--requests",
           str(knobs.api_requests), "--in-flight", str(in_flight), "--latency", str(knobs.api_latency),
           "--repeat", "3"] + (["--repo", str(tree)] if tree else [])
    log(f"  client CPU per request ({'this tree' if tree is None else tree}, {in_flight} in flight)")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout)[-1500:]}
    return json.loads(lines[-1])


# -- memory -------------------------------------------------------------------------------------------------------
def bench_memory(knobs: Knobs) -> dict[str, Any]:
    """Peak RSS of one partition's whole run at 1x and 10x the rows (streaming: it should barely move)."""
    out: dict[str, Any] = {"rows_1x": knobs.memory_rows, "rows_10x": 10 * knobs.memory_rows, "variants": {}}
    variants: dict[str, Variant] = {}
    for scale in (1, 10):
        rows = scale * knobs.memory_rows
        data = WORK / "data" / f"memory-{rows}"
        write_documents(data, rows, files=1)
        spec = ours.embed_spec(f"bench_memory_{scale}x", data, ["part-0"])
        variants[f"{scale}x"] = lambda r, spec=spec: ours.materialize(spec, ["part-0"], label=f"-{r}")
    runs = interleave(variants, knobs.repeats_for("memory", cap=2))
    res = describe(runs, ("inferred_s",))
    out["variants"] = res
    out["ratios"] = {"peak_rss_10x_vs_1x": ratio(med(res, "10x", "peak_rss_mb"), med(res, "1x", "peak_rss_mb"))}
    return out


# -- orchestration ------------------------------------------------------------------------------------------------
def bench_orchestration(knobs: Knobs) -> dict[str, Any]:
    parts = knobs.backfill_partitions
    data = WORK / "data" / f"backfill-{parts}x{knobs.backfill_rows}"
    write_documents(data, parts * knobs.backfill_rows, files=parts)
    keys = [f"part-{i}" for i in range(parts)]
    tiny = WORK / "data" / "tiny"
    write_documents(tiny, 8, files=1)
    tiny_prompts = WORK / "data" / "tiny-prompts"
    write_prompts(tiny_prompts, 8, files=1)
    server = ApiServer(0.01)
    api_env = {"BENCH_OPENAI_BASE_URL": server.base + "/v1", "BENCH_OPENAI_KEY": "bench"}
    backfill = ours.embed_spec("bench_backfill", data, keys)
    one = ours.embed_spec("bench_backfill", data, keys)
    tiny_embed = ours.embed_spec("bench_tiny", tiny, ["part-0"])
    tiny_api = ours.api_spec("bench_tiny_api", tiny_prompts, ["part-0"], 8)
    multi = {"BATCH_EXECUTOR": "multiprocess"}
    variants: dict[str, Variant] = {
        "bare dagster asset materialize (no-op asset)": lambda r: ours.materialize_noop(),
        "tiny embed partition (in_process)": lambda r: ours.materialize(tiny_embed, ["part-0"], {"BATCH_EXECUTOR": "in_process"}),
        "tiny embed partition (multiprocess forkserver)": lambda r: ours.materialize(tiny_embed, ["part-0"], multi),
        "tiny API partition (in_process)": lambda r: ours.materialize(tiny_api, ["part-0"], {**api_env, "BATCH_EXECUTOR": "in_process"}),
        "tiny API partition (multiprocess forkserver)": lambda r: ours.materialize(tiny_api, ["part-0"], {**api_env, **multi}),
        f"backfill {parts} partitions, one run (in_process)": lambda r: ours.materialize(backfill, keys, {"BATCH_EXECUTOR": "in_process"}),
        f"backfill {parts} partitions, one run (multiprocess forkserver)": lambda r: ours.materialize(backfill, keys, multi),
        "1 partition of the backfill (in_process)": lambda r: ours.materialize(one, keys[:1], {"BATCH_EXECUTOR": "in_process"}),
        **({f"tiny embed partition (before: {ours.before_label()})": lambda r: ours.materialize(
            tiny_embed, ["part-0"], tree=ours.before_tree())} if ours.before_tree() else {}),
        "raw encode of 1 partition": lambda r: run_process(
            [str(OUR_PY), str(BENCH / "raw_embed.py"), "--input", str(data / "part-0.parquet"), "--output",
             str(WORK / "out" / "raw_one.parquet")], log=WORK / "logs" / "raw-one.log"),
    }
    try:
        runs = interleave(variants, knobs.repeats_for("orchestration", cap=2))  # fixed costs vary little
    finally:
        server.close()
    res = describe(runs, ("model_loads", "inferred_s", "infer_s"))
    noop = med(res, "bare dagster asset materialize (no-op asset)")
    wall_n = med(res, f"backfill {parts} partitions, one run (in_process)")
    wall_1 = med(res, "1 partition of the backfill (in_process)")
    encode_1 = med(res, "raw encode of 1 partition", "infer_s")
    # The raw script's encode of one small partition includes torch's first-call warm-up; the steady rate comes
    # from the embed section when it ran (see main()), this is the fallback.
    per_partition = ((wall_n - wall_1) / (parts - 1) - encode_1) if wall_n and wall_1 and encode_1 else None
    return {
        "backfill_partitions": parts, "rows_per_partition": knobs.backfill_rows, "variants": res,
        "ratios": {
            "tiny_embed_in_process_vs_noop": ratio(med(res, "tiny embed partition (in_process)"), noop),
            "tiny_embed_multiprocess_vs_noop": ratio(med(res, "tiny embed partition (multiprocess forkserver)"), noop),
            "tiny_api_in_process_vs_noop": ratio(med(res, "tiny API partition (in_process)"), noop),
            "tiny_api_multiprocess_vs_noop": ratio(med(res, "tiny API partition (multiprocess forkserver)"), noop),
            "backfill_model_loads_in_process": med(res, f"backfill {parts} partitions, one run (in_process)", "model_loads"),
            "backfill_model_loads_multiprocess": med(res, f"backfill {parts} partitions, one run (multiprocess forkserver)", "model_loads"),
            "seconds_per_extra_partition": round((wall_n - wall_1) / (parts - 1), 3) if wall_n and wall_1 else None,
            "seconds_per_partition_beyond_model_compute": round(per_partition, 3) if per_partition is not None else None,
        },
    }


# -- start: a tiny partition's whole process (issue 18, P8) ------------------------------------------------------
START_RAW = "raw script, 5 rows"
START_OURS = "ours (dg launch), 5 rows"


def bench_start(knobs: Knobs) -> dict[str, Any]:
    """A 5-row partition through `dg launch` (what a sensor-triggered run of a small file costs: CLI start,
    definitions, model load, four steps, exit) against the raw script embedding the same 5 rows."""
    data = WORK / "data" / "start-5"
    write_documents(data, 5, files=1)
    spec = ours.embed_spec("bench_start", data, ["part-0"])
    variants: dict[str, Variant] = {
        START_RAW: lambda r: run_process(
            [str(OUR_PY), str(BENCH / "raw_embed.py"), "--input", str(data / "part-0.parquet"), "--output",
             str(WORK / "out" / "raw_start.parquet")], log=WORK / "logs" / f"raw-start-{r}.log"),
        START_OURS: lambda r: ours.materialize(spec, ["part-0"], label=f"-{r}", launcher="dg"),
    }
    if ours.before_tree():
        variants[f"ours before ({ours.before_label()}) (dg launch), 5 rows"] = lambda r: ours.materialize(
            spec, ["part-0"], label=f"-{r}", tree=ours.before_tree(), launcher="dg")
    runs = interleave(variants, knobs.repeats_for("start"))
    res = describe(runs, ("model_loads", "import_s", "load_s", "read_s", "infer_s", "write_s", *PHASES))
    raw, mine = med(res, START_RAW), med(res, START_OURS)
    return {"rows": 5, "repeats": knobs.repeats_for("start"), "variants": res, "ratios": {
        "ours_minus_raw_s": round(mine - raw, 2) if raw and mine else None, "ours_vs_raw": ratio(raw, mine)}}


# -- transcription (issue 26) ---------------------------------------------------------------------------------------
RAW_TRANSCRIBE = "raw faster-whisper script"
DAFT_TRANSCRIBE = "Daft @daft.cls (the post's FasterWhisperTranscriber)"
RAY_TRANSCRIBE = "Ray Data map_batches"
OURS_UNPACKED = "ours, pack_clips off (dagster asset materialize)"
SPEECH_COPIES = {"tiny": 1, "quick": 4, "full": 10}  # renditions of each of the corpus's 24 sentences


def bench_transcribe(knobs: Knobs) -> dict[str, Any]:
    """The same folder of short calls (espeak-ng speech, some with silence and noise, WAV/FLAC/MP3/OGG) transcribed
    by the raw faster-whisper script, our pipeline, Daft's `@daft.cls` and Ray Data's `map_batches`, all with Whisper
    tiny.en at int8 on CPU, beam 5, VAD on; each variant's word error rate against the spoken text beside its time,
    so a faster variant cannot be a sloppier one."""
    sys.path.insert(0, str(ROOT))  # tests/audio_corpus.py: the corpus the tests use
    from tests.audio_corpus import corpus, word_error_rate

    copies = int(os.environ.get("BENCH_SPEECH_COPIES", SPEECH_COPIES.get(knobs.profile, 4)))
    audio = WORK / "data" / f"speech-{copies}"
    clips = corpus(audio, copies)
    truth = {c.name: c.text for c in clips}
    # the same files, a folder per partition (hard links), for our `format: files` source; the peers and the raw
    # script glob the flat folder
    folders = WORK / "data" / f"speech-{copies}-parts"
    shutil.rmtree(folders, ignore_errors=True)
    for i, key in enumerate(ours.KEYS):
        (folders / key).mkdir(parents=True)
        for c in clips[i::len(ours.KEYS)]:
            os.link(audio / c.name, folders / key / c.name)
    pattern = str(audio / "call-*")
    out = WORK / "out"
    spec = ours.transcribe_spec("bench_transcribe", folders)
    variants: dict[str, Variant] = {
        RAW_TRANSCRIBE: lambda r: run_process(
            [str(OUR_PY), str(BENCH / "raw_transcribe.py"), "--input", pattern, "--output",
             str(out / "raw_transcribe.parquet")], log=WORK / "logs" / f"raw-transcribe-{r}.log"),
        OURS: lambda r: ours.materialize(spec, ours.KEYS, label=f"-{r}"),
    }
    unpacked = ours.transcribe_spec("bench_transcribe_unpacked", folders, pack_clips=False)
    if os.environ.get("BENCH_TRANSCRIBE_UNPACKED", "1") == "1":  # what packing short clips (the default) buys
        variants[OURS_UNPACKED] = lambda r: ours.materialize(unpacked, ours.KEYS, label=f"-{r}")
    if peers_ready(knobs):
        variants[DAFT_TRANSCRIBE] = lambda r: _peer(
            "daft_transcribe.py", ["--input", pattern, "--output", _fresh(out / "daft_transcribe")],
            f"daft-transcribe-{r}")
        variants[RAY_TRANSCRIBE] = lambda r: _peer(
            "ray_transcribe.py", ["--input", pattern, "--output", _fresh(out / "ray_transcribe")],
            f"ray-transcribe-{r}")
    runs = interleave(variants, knobs.repeats_for("transcribe"))
    res = describe(runs, ("infer_s", "inferred_s", "load_s", "import_s", "model_loads", *PHASES))
    outputs = {RAW_TRANSCRIBE: (out / "raw_transcribe.parquet", "path", "text"),
               OURS: (out / spec["name"], "file_path", "text"),
               OURS_UNPACKED: (out / unpacked["name"], "file_path", "text"),
               DAFT_TRANSCRIBE: (out / "daft_transcribe", "path", "result.transcript"),
               RAY_TRANSCRIBE: (out / "ray_transcribe", "path", "text")}
    for name, (where, key, column) in outputs.items():
        if name in res and where.exists():
            res[name]["wer"] = _transcript_wer(where, key, column, truth, word_error_rate)
    raw = med(res, RAW_TRANSCRIBE)
    _add_speed_vs_raw(res, raw)
    mine = med(res, OURS)
    peers = [m for m in (med(res, DAFT_TRANSCRIBE), med(res, RAY_TRANSCRIBE)) if m]
    return {"files": len(clips), "audio_s": round(_corpus_seconds(audio, clips), 1),
            "repeats": knobs.repeats_for("transcribe"), "variants": res,
            "ratios": {"ours_vs_raw_whole_process": ratio(raw, mine),
                       "ours_vs_faster_peer": ratio(min(peers), mine) if peers else None}}


def _transcript_wer(where: Path, key: str, column: str, truth: dict[str, str], wer: Callable[..., float]) -> Any:
    """The word error rate of one variant's transcripts (read back from what it wrote) against the spoken text;
    a file missing from its output counts as an empty transcript."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(where), format="parquet").to_table()
    if "." in column:
        parent, child = column.split(".")
        texts = [v[child] if v else None for v in table.column(parent).to_pylist()]
    else:
        texts = table.column(column).to_pylist()
    got = {Path(str(k)).name: t for k, t in zip(table.column(key).to_pylist(), texts)}
    names = sorted(truth)
    return {"value": round(wer([truth[n] for n in names], [got.get(n) or "" for n in names]), 4),
            "missing_files": sum(n not in got for n in names)}


def _corpus_seconds(folder: Path, clips: list[Any]) -> float:
    """Seconds of audio in the corpus, as sox measures them (`soxi -T`: the total over the files)."""
    proc = subprocess.run(["soxi", "-T", "-D", *(str(folder / c.name) for c in clips)], capture_output=True,
                          text=True, check=True)
    return float(proc.stdout.strip().splitlines()[-1])


SECTIONS: dict[str, Callable[[Knobs], dict[str, Any]]] = {
    "embed": bench_embed, "generate": bench_generate, "api": bench_api, "memory": bench_memory,
    "orchestration": bench_orchestration, "start": bench_start, "transcribe": bench_transcribe,
}


def main() -> int:
    knobs = Knobs()
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    if knobs.peers and not PEERS_PY.exists():
        log(f"no peers virtualenv at {PEERS_PY}: Daft and Ray are skipped (`make bench-peers` creates it)")
    meta = {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "profile": knobs.profile, "knobs": {k: v for k, v in vars(knobs).items()},
        "machine": machine(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True).stdout.strip(),
        "versions_ours": versions(OUR_PY, ["dagster", "torch", "sentence-transformers", "transformers", "pyarrow",
                                           "openai"]),
        "versions_peers": versions(PEERS_PY, ["daft", "ray", "torch", "sentence-transformers", "transformers",
                                              "pyarrow"]) if PEERS_PY.exists() else {},
    }
    write_json("meta", meta)
    log(f"profile {knobs.profile}: sections {', '.join(knobs.sections)}; work folder {WORK}")
    results: dict[str, Any] = carried_sections(knobs.sections)
    meta["carried"] = {name: section["run"] for name, section in results.items()}
    failed = []
    for name in knobs.sections:
        log(f"section {name}")
        start = time.perf_counter()
        try:
            results[name] = SECTIONS[name](knobs)
        except Exception:  # one broken section must not lose the others' figures; the exit code says it failed
            results[name] = {"error": traceback.format_exc()}
            failed.append(name)
            log(f"section {name} FAILED:\n{traceback.format_exc()}")
        results[name]["section_seconds"] = round(time.perf_counter() - start, 1)
        results[name]["run"] = {"date_utc": meta["date_utc"], "commit": meta["commit"], "profile": knobs.profile}
        write_json(name, results[name])
        write_doc(meta, results)  # after every section: a run cut short still leaves the figures it has
        log(f"section {name} done in {results[name]['section_seconds']}s: {json.dumps(results[name].get('ratios'))}")
    meta["load_avg_at_end"] = os.getloadavg()
    write_json("meta", meta)
    steady_state_overhead(results)
    write_doc(meta, results)
    log("results in bench/results/*.json and docs/BENCHMARKS.md")
    return 1 if failed else 0


def carried_sections(running: list[str]) -> dict[str, Any]:
    """The figures of the sections this run does not run, from their last run (bench/results/<section>.json), so a
    run of one section leaves the others' figures in docs/BENCHMARKS.md, each marked with the run it came from."""
    carried: dict[str, Any] = {}
    for name in SECTIONS:
        path = RESULTS / f"{name}.json"
        if name in running or not path.exists():
            continue
        section = json.loads(path.read_text())
        if "error" in section:
            continue
        if "run" not in section:  # written before sections recorded their run: the commit that last wrote the file
            last = subprocess.run(["git", "log", "-1", "--format=%cI %h", "--", str(path)], cwd=ROOT,
                                  capture_output=True, text=True).stdout.split()
            section["run"] = {"date_utc": last[0] if last else "?", "commit": last[1] if len(last) > 1 else "?",
                              "profile": "?"}
        carried[name] = section
    return carried


if __name__ == "__main__":
    sys.exit(main())
