"""One name per job (issue 27, "Names that mislead"): a module's file name says its job, so two modules of the product
(`batch_assets/`, `resources/`) share a file name only where it is the same job in several plug-ins (a format's
reader and writer, each provider's `provider.py`); and a project type is imported under its own name, never renamed
at the import (`PipelineSections as PipelineSpec` made two types look like one)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("batch_assets", "resources")

# The file names that may exist more than once, each with why it is one job wherever it stands.
SHARED_NAMES = {
    "__init__": "a package's face",
    "base": "the base class of its plug-in family (sinks, tasks, providers)",
    "csv": "the csv format's reader (stages/sources/) and writer (stages/sinks/)",
    "jsonl": "the jsonl format's reader and writer",
    "parquet": "the parquet format's reader and writer",
    "provider": "each model provider's resource (resources/<name>/provider.py)",
    "batch": "each hosted provider's batch API client (openai_api/, anthropic_api/)",
    "payloads": "each hosted provider's request bodies",
    "retry": "each hosted provider's classification of failed calls",
    # batch_assets/examples/ names each example for its data (anime, sentiment, catalog: a product catalog's prices),
    # and users copy `batch_assets.examples.catalog:parse_prices` from docs/transforms.md into their YAML.
    "catalog": "batch_assets/catalog.py is the pipeline catalog; examples/catalog.py the product-catalog example",
}


def test_two_modules_share_a_file_name_only_for_one_job() -> None:
    where = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where[path.stem].append(str(path.relative_to(ROOT)))
    doubled = {name: paths for name, paths in where.items() if len(paths) > 1 and name not in SHARED_NAMES}
    assert not doubled, ("file names that exist twice with different jobs: rename one to say its job (or, if it is "
                         f"one job in several plug-ins, add it to SHARED_NAMES with why): {doubled}")


def test_a_project_name_is_imported_under_its_own_name() -> None:
    renamed = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("batch_assets", "resources")):
                    # A class under another class's name; a module or function imported short (`lancedb as lance_sink`,
                    # `precision as fast_mode`) names no type.
                    renamed += [f"{path.relative_to(ROOT)}:{node.lineno}: {a.name} as {a.asname}" for a in node.names
                                if a.asname and a.asname != a.name and a.name[:1].isupper() and a.asname[:1].isupper()]
    assert not renamed, f"a type imported under another type's name reads as a different type: {renamed}"
