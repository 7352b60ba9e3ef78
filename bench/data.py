"""The benchmark's inputs, generated once per size and reused by every variant: short documents for the
embedding job, chat prompts for the generation and API jobs. Deterministic (fixed seed), Parquet, 4 files."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ("the a river city market quietly music garden engine winter report signal paper window forest "
         "orbit harbor coffee bridge storm silver lantern morning travel energy story science ocean village "
         "station mountain teacher library museum kitchen festival planet camera season harvest doctor island "
         "machine language history summer friend street painting letter garden stone valley").split()
TOPICS = ("astronomy", "cooking", "finance", "sports", "travel", "music", "health", "history")
COMPANIES = ("Acme Law Group", "Harbor Medical Center", "Nova Software Inc", "Quinn & Baker LLP", "Summit Capital",
             "Cedar Realty", "Orbit Retail Group", "Apex Manufacturing Co", "Willow Consulting", "Delta Bank")
FILES = 4


def _doc(rng: random.Random) -> str:
    # ~12-20 words, the short-document regime of the measurements.
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 20))).capitalize() + "."


def company_names(rows: int) -> list[str]:
    """Numbered company names, one per row, for the one-process generator measurements (levers_generator.py,
    generator_prefix_cache.py); they cycle through the first eight companies, as those measurements always have."""
    return [f"{COMPANIES[i % 8]} {i}" for i in range(rows)]


def write_documents(folder: Path, rows: int, files: int = FILES, seed: int = 7) -> list[Path]:
    """`rows` documents split evenly over `files` Parquet files (doc_id, topic, text). Reused when present."""
    return _write_parts(folder, rows, files, seed, "D", lambda rng, ids: {
        "doc_id": ids, "topic": [rng.choice(TOPICS) for _ in ids], "text": [_doc(rng) for _ in ids]},
        row_group_size=4096)


def write_prompts(folder: Path, rows: int, files: int = FILES, seed: int = 11) -> list[Path]:
    """Short chat prompts (id, company, question) for generation and the API path."""
    def columns(rng: random.Random, ids: list[str]) -> dict[str, list[str]]:
        companies = [f"{rng.choice(COMPANIES)} {rng.randint(1, 999)}" for _ in ids]
        questions = [f"In one short phrase, what industry is {c} in?" for c in companies]
        return {"prompt_id": ids, "company": companies, "question": questions}

    return _write_parts(folder, rows, files, seed, "P", columns)


def _write_parts(folder: Path, rows: int, files: int, seed: int, id_prefix: str,
                 columns: Callable[[random.Random, list[str]], dict[str, list[str]]],
                 **write_options: Any) -> list[Path]:
    """`rows` rows over `files` Parquet files (ids <prefix>0000000.., the rest drawn by `columns` from one seeded
    generator, file after file, so a size always gives the same data). Reused when all files are present; each
    appears whole (written aside, then renamed), so an interrupted run never leaves a short file to reuse."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i}.parquet" for i in range(files)]
    if all(p.exists() for p in paths):
        return paths
    rng = random.Random(seed)
    per = -(-rows // files)
    for i, path in enumerate(paths):
        n = max(0, min(per, rows - i * per))
        ids = [f"{id_prefix}{i * per + j:07d}" for j in range(n)]
        tmp = path.with_suffix(".tmp")
        pq.write_table(pa.table(columns(rng, ids)), tmp, **write_options)
        tmp.replace(path)
    return paths
