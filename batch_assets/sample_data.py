"""Deterministic sample datasets for the demo pipelines (`source.sample`), generated on first use so a fresh clone
has real data to run on.

Demo data, not a stage: only a pipeline whose spec declares `source.sample` ever comes here (the raw asset and the
sensor ask first), and it never writes where data already is. A pipeline copied from an example (the Component's
scaffold declares `sample: documents`) and pointed at a folder of the user's own files keeps reading exactly those
files: no generated rows are mixed in, and no file of theirs is replaced, whatever it holds.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections.abc import Callable
from datetime import date, timedelta

from batch_assets.partition_files import is_data_path
from batch_assets.partitions import partition_kind
from batch_assets.spec import PARTITION_TOKEN, PipelineSpec
from batch_assets.storage import atomic_output, filesystem_for

SURNAMES = ["Alvarez", "Baker", "Chen", "Dubois", "Evans", "Fischer", "Garcia", "Hughes", "Ito", "Jensen", "Khan",
            "Larsen", "Moreau", "Novak", "Okafor", "Patel", "Quinn", "Rossi", "Silva", "Tanaka", "Usman", "Varga",
            "Weber", "Xu", "Yilmaz", "Zhang"]
FIRST = ["Ana", "Ben", "Chloe", "Dev", "Ema", "Finn", "Gia", "Hugo", "Isla", "Jon", "Kai", "Lena", "Mia", "Noah"]
WORDS = ["Apex", "Blue", "Cedar", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Iris", "Juniper", "Keystone",
         "Lumen", "Maple", "Nova", "Orbit", "Pioneer", "Quartz", "Summit", "Vertex", "Willow"]
CITIES = [("Lisbon", "Portugal"), ("Austin", "United States"), ("Lyon", "France"), ("Osaka", "Japan"),
          ("Toronto", "Canada"), ("Munich", "Germany"), ("Nairobi", "Kenya"), ("Sydney", "Australia"),
          ("Pune", "India"), ("Bogota", "Colombia")]
# Company-name shapes that hint at an industry, so the model has something to go on; each shape's true industry is
# recorded with the row (`true_industry`), a golden label the evaluation scores answers against.
COMPANY_SHAPES: dict[str, str] = {
    "{s} & {s2} LLP": "Law Firm", "{s} Law Group": "Law Firm",
    "{s} Health Partners": "Healthcare", "{w} Medical Center": "Healthcare",
    "{w} Technologies": "Technology", "{w} Software Inc": "Technology",
    "{w} Retail Group": "Retail", "{s}'s Market": "Retail",
    "{s} Consulting": "Consulting", "{w} Advisory": "Consulting",
    "{w} Manufacturing Co": "Manufacturing", "{w} Industrial Works": "Manufacturing",
    "{w} Capital": "Finance", "{s} Bank": "Finance",
    "{w} Realty": "Real Estate", "{s} Properties": "Real Estate",
    "{w} & {w2} Holdings": "Other",
}
TOPICS = {
    "astronomy": ["telescopes resolve distant galaxies", "a comet passed close to the sun", "the moon's orbit slowly widens"],
    "cooking": ["slow roasting brings out sweetness", "fresh basil lifts a tomato sauce", "bread needs time to proof"],
    "finance": ["bond yields rose after the report", "diversified portfolios reduce risk", "the central bank held rates"],
    "sports": ["the striker scored in extra time", "marathon training builds endurance", "the team won the final"],
    "travel": ["night trains cross the mountains", "the old town is best on foot", "ferries link the islands"],
}
REVIEW_BITS = {
    "positive": ["works perfectly", "I love it", "great value for money", "exceeded my expectations", "would buy again"],
    "negative": ["broke after a week", "a waste of money", "terrible customer service", "does not work", "very disappointed"],
}
QUOTES = [
    "I am going to be the king of the pirates!", "I'm going to be the next Hokage!",
    "People's dreams... never end!", "A lesson without pain is meaningless.", "Believe in the me that believes in you!",
    "If you don't take risks, you can't create a future.", "Whatever happens, happens.", "Plus Ultra!",
]


def _customers(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        shape = rng.choice(list(COMPANY_SHAPES))
        city, country = rng.choice(CITIES)
        first, last = rng.choice(FIRST), rng.choice(SURNAMES)
        company = shape.format(s=rng.choice(SURNAMES), s2=rng.choice(SURNAMES), w=rng.choice(WORDS), w2=rng.choice(WORDS))
        slug = "".join(ch for ch in company.lower() if ch.isalnum())[:20]
        rows.append({
            "customer_id": f"C{i:06d}", "first_name": first, "last_name": last, "company": company,
            "city": city, "country": country, "email": f"{first.lower()}.{last.lower()}@{slug}.example",
            "subscription_date": str(date(2024, 1, 1) + timedelta(days=rng.randrange(700))),
            "website": f"https://{slug}.example", "true_industry": COMPANY_SHAPES[shape],
        })
    return rows


def _documents(rng: random.Random, n: int) -> list[dict]:
    rows = []
    topics = sorted(TOPICS)
    for i in range(n):
        topic = rng.choice(topics)
        sentences = rng.sample(TOPICS[topic], k=2) + [f"note {rng.randrange(10_000)} on {topic}"]
        rows.append({"doc_id": f"D{i:06d}", "topic": topic, "title": f"{topic.title()} note {i}",
                     "text": ". ".join(sentences).capitalize() + ".",
                     "created_at": f"2026-11-{1 + i % 7:02d}T{rng.randrange(24):02d}:00:00"})
    return rows


def _reviews(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        mood = rng.choice(sorted(REVIEW_BITS))
        rows.append({"review_id": f"R{i:06d}", "product": f"{rng.choice(WORDS)} blender",
                     "review_text": f"{rng.choice(REVIEW_BITS[mood]).capitalize()}, {rng.choice(REVIEW_BITS[mood])}.",
                     "true_sentiment": mood})
    return rows


def _quotes(rng: random.Random, n: int) -> list[dict]:
    return [{"quote_id": f"Q{i:06d}", "quote": QUOTES[i % len(QUOTES)]} for i in range(n)]


GENERATORS: dict[str, Callable[[random.Random, int], list[dict]]] = {
    "customers": _customers, "documents": _documents, "reviews": _reviews, "quotes": _quotes,
}


def sample_targets(spec: PipelineSpec) -> list[str]:
    """The files a sample dataset is split over: one per static key, or 4 files for a glob path."""
    path = spec.source.path
    if PARTITION_TOKEN in path:
        keys = spec.partitioning.keys or [f"part-{i}" for i in range(4)]
        return [path.replace(PARTITION_TOKEN, k) for k in keys]
    if "*" in path:
        return [path.replace("*", f"part-{i}", 1) for i in range(4)]
    return [path]


def ensure_sample(spec: PipelineSpec, keys: list[str] | None = None) -> list[str]:
    """Write the spec's sample dataset where its source path points, if nothing is there; the files written.

    Nothing is written when any file already matches the source path (`{partition}` and globs as wildcards): they
    are the data, ours from an earlier run or the user's, and the read stage checks their columns. Daily pipelines
    get one file per requested day (`keys`) whose file is missing, `sample_rows` rows each, the same for a day on
    every machine, so a schedule on a fresh clone finds yesterday's file whatever today is.
    """
    if spec.source.sample is None:
        return []
    if partition_kind(spec).days and PARTITION_TOKEN in spec.source.path:
        return _ensure_daily_sample(spec, keys or [])
    if _data_at(spec.source.path):
        return []
    targets = sample_targets(spec)
    rows = GENERATORS[spec.source.sample](random.Random(20261121), spec.source.sample_rows)
    per = -(-len(rows) // len(targets))
    for i, target in enumerate(targets):
        chunk = rows[i * per : (i + 1) * per]
        fs, path = filesystem_for(target)
        with atomic_output(fs, path) as f:
            f.write(_encode(chunk, spec.source.format))
    return targets


def _data_at(source_path: str) -> bool:
    """Whether any file matches the source path, `{partition}` standing for any key (a writer's temporary files,
    markers and staging folders are never data: partition_files.is_data_path)."""
    fs, path = filesystem_for(source_path.replace(PARTITION_TOKEN, "*"))
    if not any(ch in path for ch in "*?["):
        return fs.exists(path)
    return any(is_data_path(name, path)
               for name, info in fs.glob(path, detail=True).items() if info.get("type") != "directory")


def _encode(rows: list[dict], fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8")
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue().encode("utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def _ensure_daily_sample(spec: PipelineSpec, days: list[str]) -> list[str]:
    made = []
    for day in days:
        target = spec.source.path.replace(PARTITION_TOKEN, day)
        fs, path = filesystem_for(target)
        if fs.exists(path):
            continue
        rows = GENERATORS[spec.source.sample](random.Random(f"20261121-{day}"), spec.source.sample_rows)
        id_column = next(iter(rows[0])) if rows else None
        for row in rows:  # ids unique across days, not only within one
            row[id_column] = f"{day}-{row[id_column]}"
        with atomic_output(fs, path) as f:
            f.write(_encode(rows, spec.source.format))
        made.append(target)
    return made
