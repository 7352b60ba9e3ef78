"""Shared plumbing of the benchmark harness: size knobs, timing whole processes (wall and peak RSS), and
summaries (median and spread over interleaved repeats)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from script_io import RESULT_PREFIX

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
# BENCH_PYTHON: the interpreter that runs the raw scripts and our CLI, where the product is not in .venv (a lent GPU
# machine: its own python3 with the carried wheels on PYTHONPATH, bench/gpu/run_on_device.sh)
OUR_PY = Path(os.environ.get("BENCH_PYTHON", str(ROOT / ".venv" / "bin" / "python")))
PEERS_VENV = BENCH / ".venv-peers"
PEERS_PY = PEERS_VENV / "bin" / "python"
WORK = Path(os.environ.get("BENCH_WORK", str(BENCH / "work")))
RESULTS = Path(os.environ.get("BENCH_RESULTS", str(BENCH / "results")))
DOC = Path(os.environ.get("BENCH_DOC", str(ROOT / "docs" / "BENCHMARKS.md")))


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


@dataclass
class Knobs:
    """Sizes, from the environment. BENCH_PROFILE=quick (default), full (the issue's sizes) or tiny (smoke test)."""

    profile: str = os.environ.get("BENCH_PROFILE", "quick")
    repeats: int = 0
    docs: int = 0
    prompts: int = 0
    api_requests: int = 0
    api_latency: float = 0.0
    api_in_flight: int = 64
    api_wide_in_flight: int = 1000
    memory_rows: int = 0
    backfill_partitions: int = 10
    backfill_rows: int = 0
    sections: list[str] = field(default_factory=list)
    peers: bool = True

    def repeats_for(self, section: str, cap: int | None = None) -> int:
        """BENCH_REPEATS_<SECTION> overrides BENCH_REPEATS for one section (e.g. fewer for the slow ones)."""
        value = _int(f"BENCH_REPEATS_{section.upper()}", self.repeats if cap is None else min(self.repeats, cap))
        return max(1, value)

    def __post_init__(self) -> None:
        full = self.profile == "full"
        tiny = self.profile == "tiny"
        self.repeats = _int("BENCH_REPEATS", 1 if tiny else 3)
        self.docs = _int("BENCH_DOCS", 40 if tiny else 10_000 if full else 4_000)
        self.prompts = _int("BENCH_PROMPTS", 8 if tiny else 256 if full else 96)
        self.api_requests = _int("BENCH_API_REQUESTS", 40 if tiny else 4_000 if full else 1_000)
        self.api_latency = _float("BENCH_API_LATENCY", 0.05 if tiny else 0.25)
        self.api_in_flight = _int("BENCH_API_IN_FLIGHT", 64)
        self.api_wide_in_flight = _int("BENCH_API_WIDE_IN_FLIGHT", 1000)
        self.memory_rows = _int("BENCH_MEMORY_ROWS", 20 if tiny else 2_000 if full else 1_000)
        self.backfill_partitions = _int("BENCH_BACKFILL_PARTITIONS", 3 if tiny else 10)
        self.backfill_rows = _int("BENCH_BACKFILL_ROWS", 5 if tiny else 100)
        default_sections = "embed,api,orchestration,generate,memory,start,transcribe"
        self.sections = [s for s in os.environ.get("BENCH_SECTIONS", default_sections).split(",") if s]
        self.peers = os.environ.get("BENCH_PEERS", "0" if tiny else "1") == "1"


@dataclass
class Run:
    wall_s: float
    peak_rss_mb: float
    rc: int
    result: dict[str, Any]
    log_tail: str
    log_path: Path
    start_epoch: float = 0.0
    end_epoch: float = 0.0
    cpu_s: float = 0.0  # user + system CPU of the process and its waited-for children


def run_process(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
                timeout: float = 1800, log: Path | None = None) -> Run:
    """Run `cmd` as a whole process; wall time and the peak RSS of it and its waited-for children."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    log = log or (WORK / "logs" / f"{int(time.time() * 1000)}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    start, start_epoch = time.perf_counter(), time.time()
    with open(log, "w") as out:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, env=full_env, cwd=cwd or ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text(errors="replace")
    result: dict[str, Any] = {}
    for line in text.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line.removeprefix(RESULT_PREFIX))
    return Run(wall, usage.ru_maxrss / 1024, proc.returncode, result, text[-3000:], log, start_epoch, time.time(),
               usage.ru_utime + usage.ru_stime)


def summary(values: list[float]) -> dict[str, float]:
    """Median and spread (min, max, and max-min as a share of the median) of repeated measurements."""
    if not values:
        return {}
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "n": len(values),
            "spread_pct": 100 * (max(values) - min(values)) / med if med else 0.0}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gib"] = round(int(mem) / 2**20, 1)
        info["load_avg_at_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def versions(python: Path, packages: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    try:
        proc = subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout or "{}")
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return {}


def write_json(name: str, data: Any) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def cli(name: str) -> list[str]:
    """The command that runs our CLI `name` (dagster, dg): BENCH_<NAME> when set (split like a shell line, e.g.
    `python3 -m dagster` where the wheels were installed with `pip --target` and no venv has the script), else the
    script in .venv."""
    override = os.environ.get(f"BENCH_{name.upper()}")
    return shlex.split(override) if override else [str(ROOT / ".venv" / "bin" / name)]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextmanager
def llama_base_url(url: str | None) -> Iterator[str]:
    """The /v1 URL of a llama.cpp server: `url` when given (a server you run), else one started on loopback for the
    duration of the block (tests/resources/openai_api/llama_server.py) and stopped after it."""
    if url is not None:
        yield url
        return
    from tests.resources.openai_api.llama_server import start_llama_server  # the test fixture's launcher: only when needed

    server = start_llama_server(embedding=False)
    try:
        yield server.base_url
    finally:
        server.stop()
