"""What the harness (common.run_process) and each script it times agree on, for our raw baselines and the peers'
scripts alike: `--input 'DIR/*.parquet' --output PATH` on the command line, and one `BENCH_RESULT {json}` line on
stdout with seconds counted from the script's own start (the harness times the whole process itself).

Standard library only: the peers' scripts import it in their own virtualenv."""

from __future__ import annotations

import argparse
import json
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "


def arguments() -> argparse.ArgumentParser:
    """The parser with the two arguments every script takes; each adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True, help="a glob of the input Parquet files")
    ap.add_argument("--output", required=True)
    return ap


def report(**fields: Any) -> None:
    print(RESULT_PREFIX + json.dumps(fields))


def report_phases(rows: int, start: float, imported: float, loaded: float, read: float, inferred: float,
                  written: float, infer_window: list[float]) -> None:
    """A raw baseline's result: the seconds of each phase between the marks (time.perf_counter), and the epoch
    seconds its inference ran between (bench/gpu averages GPU utilisation over that window)."""
    report(rows=rows, import_s=imported - start, load_s=loaded - imported, read_s=read - loaded,
           infer_s=inferred - read, write_s=written - inferred, total_s=written - start, infer_window=infer_window)
