"""Turns a benchmark run's results into the tables of docs/BENCHMARKS.md (between the bench markers; the rest of
the document, the analysis and the levers' log, is written by hand and kept)."""

from __future__ import annotations

from typing import Any

from common import DOC, write_json

# The raw script's variant name in the embed section's results (bench/run.py runs it).
RAW_EMBED = "raw sentence-transformers script"

BEGIN = "<!-- bench:results:begin (written by `make bench`; edit outside these markers) -->"
END = "<!-- bench:results:end -->"

# (section, ratio key, goal, comparison, what the issue asks)
TARGETS = [
    ("embed", "ours_vs_raw_whole_process", 0.95, ">=", "embeddings, whole process, ours ÷ raw script"),
    ("embed", "ours_infer_step_vs_raw_encode", 0.98, ">=", "embeddings, infer step ÷ raw `encode`"),
    ("embed", "ours_vs_faster_peer", 1.25, ">=", "embeddings, ours ÷ the faster of Daft and Ray Data"),
    ("embed", "ours_fast_vs_raw_whole_process", 2.0, ">=",
     "embeddings with `precision: fast`, whole process, ours ÷ raw script"),
    ("embed", "fast_recall_at_10_vs_raw", 0.99, ">=",
     "embeddings with `precision: fast`: recall@10 against the raw script's vectors, on the benchmark's documents"),
    ("generate", "ours_vs_raw_whole_process", 1.25, ">=", "LLM generation end to end ÷ raw batched `generate`"),
    ("api", "ours_vs_ideal", 0.95, ">=", "API path at 64 in flight, request phase ÷ ideal (in flight ÷ latency)"),
    ("api", "ours_wide_vs_ideal", 0.75, ">=",
     "API path at 1,000 in flight, request phase ÷ ideal (in flight ÷ latency)"),
    ("api", "ours_wide_vs_daft_request_phase", 1.0, ">=",
     "API path at 1,000 in flight ÷ Daft `prompt`, request phase (req/s at the server)"),
    ("api", "ours_wide_vs_daft_whole_process", 1.0, ">=", "API path at 1,000 in flight ÷ Daft `prompt`, whole process"),
    ("api", "client_cpu_ms_per_request", 0.3, "<=", "API client CPU per request, ms (infer step at 1,000 in flight)"),
    ("api", "ours_vs_Ray Data LLM HttpRequestProcessor (defaults)", 1.0, ">=", "API path ÷ Ray Data LLM"),
    ("memory", "peak_rss_10x_vs_1x", 1.2, "<=", "peak RSS at 10× rows ÷ at 1×"),
    ("orchestration", "backfill_model_loads_in_process", 1, "==", "single-run backfill: model loads"),
    ("orchestration", "tiny_embed_in_process_vs_noop", 2.0, "<=",
     "tiny one-partition materialization ÷ bare no-op materialize (embedding pipeline: imports torch, loads MiniLM)"),
    ("orchestration", "tiny_api_in_process_vs_noop", 2.0, "<=",
     "tiny one-partition materialization ÷ bare no-op materialize (API pipeline: no model in process)"),
    ("start", "ours_minus_raw_s", 3.0, "<=",
     "a 5-row partition via `dg launch`, whole process: seconds beyond the raw script on the same 5 rows"),
    ("transcribe", "ours_vs_raw_whole_process", 1.0, ">=", "transcription, whole process, ours ÷ raw faster-whisper script"),
    ("transcribe", "ours_vs_faster_peer", 1.25, ">=", "transcription, ours ÷ the faster of Daft `@daft.cls` and Ray Data"),
]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _load(values: Any) -> str:
    return "—" if not values else "/".join(f"{v:.1f}" for v in values)


def _met(value: float | None, goal: float, op: str) -> str:
    if value is None:
        return "not measured"
    ok = value >= goal if op == ">=" else value <= goal if op == "<=" else value == goal
    if ok:
        return "met"
    return f"missed by {abs(value - goal) / goal * 100:.0f}%" if goal else "missed"


def _variants_table(section: dict[str, Any], extra: list[tuple[str, str, str]]) -> list[str]:
    head = "| variant | median s | min–max s (spread) | " + " | ".join(h for _, h, _ in extra) + " | peak RSS MB |"
    lines = [head, "|---|---:|---:|" + "---:|" * len(extra) + "---:|"]
    for name, v in section.get("variants", {}).items():
        wall = v.get("wall_s") or {}
        if not wall:
            lines.append(f"| {name} | failed | | " + " | ".join("" for _ in extra) + " | |")
            continue
        cells = []
        for key, _, kind in extra:
            value = v.get(key)
            if isinstance(value, dict):
                value = value.get("median")
            cells.append(_fmt(value, 3 if kind == "ratio" else 1))
        rss = (v.get("peak_rss_mb") or {}).get("median")
        lines.append(f"| {name} | {wall['median']:.1f} | {wall['min']:.1f}–{wall['max']:.1f} ({wall['spread_pct']:.0f}%)"
                     f" | " + " | ".join(cells) + f" | {_fmt(rss, 0)} |")
    return lines


def _local_model_table(section: dict[str, Any], heading: str, raw_infer_header: str) -> list[str]:
    """A local model's variants beside the raw script: speed relative to it, and its inference call against our
    infer step."""
    return ["", heading, ""] + _variants_table(section, [
        ("speed_vs_raw", "speed ÷ raw", "ratio"), ("infer_s", raw_infer_header, "s"),
        ("inferred_s", "our infer step s", "s")])


PHASES = [("phase_cli_start_and_definitions_s", "CLI start, imports, definitions load (before the run's first event)"),
          ("phase_resource_init_s", "resource init (imports torch, loads the model)"),
          ("phase_step_raw_s", "read step"), ("phase_step_prepared_s", "prepare step"),
          ("phase_step_inferred_s", "infer step"), ("phase_step_output_s", "write step"),
          ("phase_exit_s", "after the run's last event (exit)")]


def _phases(title: str, section: dict[str, Any], raw_name: str) -> list[str]:
    """Where our whole process's time goes (medians, from the run's event log) beside the raw script's phases."""
    ours = next((v for k, v in section["variants"].items() if k.startswith("ours (")), None)
    raw = section["variants"].get(raw_name, {})
    if not ours or not ours.get("wall_s"):
        return []

    def m(entry: dict[str, Any], key: str) -> float | None:
        value = entry.get(key)
        return value.get("median") if isinstance(value, dict) else None

    lines = ["", f"{title}, where the time goes (medians, seconds): ours from the run's event log; the raw script "
             "from its own clock.", "", "| phase | ours | raw script |", "|---|---:|---:|"]
    raw_cells = {"phase_cli_start_and_definitions_s": m(raw, "import_s"), "phase_resource_init_s": m(raw, "load_s"),
                 "phase_step_raw_s": m(raw, "read_s"), "phase_step_inferred_s": m(raw, "infer_s"),
                 "phase_step_output_s": m(raw, "write_s")}
    for key, text in PHASES:
        lines.append(f"| {text} | {_fmt(m(ours, key), 1)} | {_fmt(raw_cells.get(key), 1)} |")
    lines.append(f"| whole process | {_fmt(m(ours, 'wall_s'), 1)} | {_fmt(m(raw, 'wall_s'), 1)} |")
    return lines


def _transcribe_table(tr: dict[str, Any] | None) -> list[str]:
    if not tr or "variants" not in tr:
        return []
    lines = ["", f"#### Transcription: {tr['files']} short calls ({tr['audio_s']:.0f} s of espeak-ng speech, WAV/FLAC/"
             f"MP3/OGG, some with silence and noise), Whisper tiny.en int8 on CPU, beam 5, VAD on; median of "
             f"{tr['repeats']} interleaved runs; WER against the spoken text", ""]
    lines += _variants_table(tr, [("speed_vs_raw", "speed ÷ raw", "ratio"), ("infer_s", "raw transcribe s", "s"),
                                  ("inferred_s", "our infer step s", "s")])
    lines += ["", "Word error rate of each variant's output: " + "; ".join(
        f"{name} {_fmt((v.get('wer') or {}).get('value'), 3)}"
        + (f" ({v['wer']['missing_files']} files missing)" if (v.get("wer") or {}).get("missing_files") else "")
        for name, v in tr["variants"].items()) + "."]
    return lines


def render(meta: dict[str, Any], results: dict[str, Any]) -> str:
    m = meta.get("machine", {})
    lines = [
        f"### Run of {meta['date_utc']} (profile `{meta['profile']}`, commit {meta.get('commit')})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs, {m.get('memory_gib')} GiB, {m.get('platform')}, "
        f"Python {m.get('python')}; load average (1, 5, 15 min) at start {_load(m.get('load_avg_at_start'))}, at end "
        f"{_load(meta.get('load_avg_at_end'))}. "
        "The machine is shared with other developers' test runs: trust the interleaved ratios over absolute seconds.",
        "",
        "Versions (ours): " + ", ".join(f"{k} {v}" for k, v in meta.get("versions_ours", {}).items()) + ".  ",
        "Versions (peers' virtualenv): " + (", ".join(f"{k} {v}" for k, v in meta.get("versions_peers", {}).items())
                                           or "not installed") + ".",
        "",
        *_carried(meta),
        "#### Targets",
        "",
        "| target | measured | goal | verdict |",
        "|---|---:|---:|---|",
    ]
    for section, key, goal, op, text in TARGETS:
        value = (results.get(section) or {}).get("ratios", {}).get(key)
        digits = 4 if "recall" in key else 2  # a recall of 0.9887 must not print as 0.99
        lines.append(f"| {text} | {_fmt(value, digits)} | {op} {goal} | {_met(value, goal, op)} |")
    emb = results.get("embed")
    if emb and "variants" in emb:
        lines += _local_model_table(emb, f"#### Embeddings: {emb['rows']:,} short documents in {emb['files']} "
                                    f"Parquet files, all-MiniLM-L6-v2 on CPU, median of {emb['repeats']} interleaved "
                                    "runs", "raw encode s")
        fid = emb.get("fast_fidelity") or {}
        if fid:
            lines += ["", "`precision: fast` against the raw script's vectors (torch, float32), on the same "
                      f"documents (bench/fidelity.py): recall@10 {_fmt(fid.get('recall_at_10'), 4)}, min cosine "
                      f"{_fmt(fid.get('min_cosine'), 6)}, mean cosine {_fmt(fid.get('mean_cosine'), 6)} over "
                      f"{_fmt(fid.get('rows'))} rows" if "error" not in fid else
                      f"`precision: fast` fidelity not measured: {fid['error']}"]
        fast = emb.get("ratios", {}).get("fast_partitions_of_4")
        if fast is not None:
            lines += ["", f"`precision: fast` ran fast on {int(fast)} of the 4 partitions: each partition's own probe "
                      "(recall@10 of bf16 against exact on 512 of its rows, extended to its size) decides, and a "
                      "partition that fails the 0.99 bar runs exact. Where it ran exact, the recall above is exact's "
                      "and the time includes the probe (docs/providers-local-cpu.md)."]
    for title, section, raw_name in (("Embeddings", emb, RAW_EMBED),
                                     ("Generation", results.get("generate"), "raw batched generate")):
        if section and "variants" in section:
            lines += _phases(title, section, raw_name)
    gen = results.get("generate")
    if gen and "variants" in gen:
        lines += _local_model_table(gen, f"#### Local generation: {gen['rows']} prompts, SmolLM2-135M-Instruct via "
                                    f"transformers, {gen['max_new_tokens']} new tokens, greedy, median of "
                                    f"{gen['repeats']}", "raw generate s")
    api = results.get("api")
    if api and "variants" in api:
        lines += ["", f"#### API path: {api['requests']:,} requests to a loopback OpenAI-compatible server answering "
                  f"after {api['latency_s']} s; ideal at {api['in_flight']} in flight = "
                  f"{api['ideal_requests_per_s']:.0f} req/s; median of {api['repeats']}", ""]
        lines += _variants_table(api, [("requests_per_s", "req/s (server window)", "s"),
                                       ("vs_ideal", "÷ ideal", "ratio"), ("max_in_flight", "most in flight", "s"),
                                       ("cpu_s", "process CPU s", "s")])
        cpu = api.get("client_cpu") or {}
        if cpu:
            lines += ["", f"Client CPU per request: the infer step alone (bench/infer_loop.py api, no Dagster) at "
                      f"{api.get('wide_in_flight', '—')} in flight against the same server, median of 3: "
                      + "; ".join(f"{label} {_fmt(c.get('cpu_ms_per_request'), 3)} ms ({_fmt(c.get('req_per_s'), 0)} "
                                  f"req/s, load {_fmt(c.get('load_avg_1m'), 1)})" if "error" not in c else
                                  f"{label} failed" for label, c in cpu.items()) + "."]
    mem = results.get("memory")
    if mem and "variants" in mem:
        lines += ["", f"#### Memory: one embedding partition, {mem['rows_1x']:,} vs {mem['rows_10x']:,} rows "
                  "(whole process, peak RSS from wait4)", ""]
        lines += _variants_table(mem, [("inferred_s", "infer step s", "s")])
    orch = results.get("orchestration")
    if orch and "variants" in orch:
        lines += ["", f"#### Orchestration: fixed cost, and a single-run backfill of {orch['backfill_partitions']} "
                  f"partitions × {orch['rows_per_partition']} rows", ""]
        lines += _variants_table(orch, [("model_loads", "model loads", "s")])
        r = orch.get("ratios", {})
        lines += ["", f"Seconds per extra partition in one run (in_process): {_fmt(r.get('seconds_per_extra_partition'), 2)}"
                  f" = (backfill wall − 1-partition wall) ÷ (partitions − 1); beyond model compute: "
                  f"{_fmt(r.get('seconds_per_partition_beyond_model_compute'), 2)} (model compute of one partition "
                  f"= {_fmt(orch.get('model_compute_per_partition_s'), 2)} s at the raw script's steady encode rate "
                  "from the embed section). Peak RSS under multiprocess is the CLI process only: its step processes "
                  "are children of the forkserver."]
    start = results.get("start")
    if start and "variants" in start:
        lines += ["", f"#### Start: one partition of {start['rows']} rows, whole process (`dg launch` vs the raw "
                  f"script on the same rows), median of {start['repeats']} interleaved runs", ""]
        lines += _variants_table(start, [("model_loads", "model loads", "s")])
        lines += _phases("Start", start, "raw script, 5 rows")
    lines += _transcribe_table(results.get("transcribe"))
    for name, section in results.items():
        if "error" in section:
            lines += ["", f"Section `{name}` failed: see bench/results/{name}.json."]
    return "\n".join(lines)


def _carried(meta: dict[str, Any]) -> list[str]:
    """Which sections were not run this time, and the run each one's figures come from."""
    carried = meta.get("carried") or {}
    if not carried:
        return []
    runs = "; ".join(f"`{name}` from the run of {run.get('date_utc')} (commit {run.get('commit')})"
                     for name, run in sorted(carried.items()))
    return [f"Not rerun this time, shown from their last run (bench/results/<section>.json): {runs}.", ""]


def write_doc(meta: dict[str, Any], results: dict[str, Any]) -> None:
    block = f"{BEGIN}\n{render(meta, results)}\n{END}"
    if DOC.exists():
        text = DOC.read_text()
        if BEGIN in text and END in text:
            text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
        else:
            text = text.rstrip() + "\n\n## Latest results\n\n" + block + "\n"
    else:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        text = "# Benchmarks\n\n## Latest results\n\n" + block + "\n"
    DOC.write_text(text)


def steady_state_overhead(results: dict[str, Any]) -> None:
    """Seconds per partition beyond model compute, with model compute at the raw script's steady encode rate from
    the embed section (rows ÷ its encode seconds) rather than one tiny partition's warm-up-laden encode."""
    emb, orch = results.get("embed", {}), results.get("orchestration", {})
    raw = emb.get("variants", {}).get(RAW_EMBED, {})
    encode = (raw.get("infer_s") or {}).get("median")
    extra = orch.get("ratios", {}).get("seconds_per_extra_partition")
    if encode and extra is not None:
        compute = orch["rows_per_partition"] * encode / emb["rows"]
        orch["ratios"]["seconds_per_partition_beyond_model_compute"] = round(extra - compute, 3)
        orch["model_compute_per_partition_s"] = round(compute, 3)
        write_json("orchestration", orch)


if __name__ == "__main__":
    # Re-render docs/BENCHMARKS.md from bench/results/*.json (e.g. after changing this file), without re-running.
    import json

    from common import RESULTS

    meta = json.loads((RESULTS / "meta.json").read_text())
    results = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json")) if p.stem != "meta"}
    steady_state_overhead(results)
    write_doc(meta, results)
