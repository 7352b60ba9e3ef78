"""The partitioning kind is decided in one place: the `KINDS` table of batch_assets/partitions.py (one class per
kind, like the task table). Every other module asks the spec's kind, so a new kind is one class plus one table entry
plus its name in registries.py, and no launch path can drift from another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from batch_assets.partitions import KINDS, PartitionKind, partition_kind, resolve_partition
from batch_assets.registries import DIMENSION_KINDS, PARTITION_KINDS
from batch_assets.spec import SpecError, parse_spec

PACKAGE = Path(__file__).resolve().parents[1] / "batch_assets"
NAMES = set(PARTITION_KINDS)


def _kind_constants(node: ast.AST) -> set[str]:
    """Partition-kind names written as constants in `node` (a string, or a tuple / list / set of strings)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_kind_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def _names_a_kind(node: ast.AST) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "kind") or (isinstance(n, ast.Attribute) and n.attr == "kind")
               for n in ast.walk(node))


def kind_decisions(source: str) -> list[tuple[int, str]]:
    """(line, code) of every comparison of a kind against a partition kind's name, and of every dict keyed by two or
    more partition kinds."""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(_kind_constants(n) for n in operands) and any(_names_a_kind(n) for n in operands):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict) and len({k.value for k in node.keys
                                                 if isinstance(k, ast.Constant) and k.value in NAMES}) >= 2:
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_table_has_one_class_per_kind_the_spec_accepts() -> None:
    assert tuple(KINDS) == PARTITION_KINDS
    for name, kind in KINDS.items():
        assert kind.kind == name and issubclass(kind, PartitionKind)
    assert {name for name, kind in KINDS.items() if kind.dimension} == set(DIMENSION_KINDS)


def test_no_module_outside_the_table_decides_the_partition_kind() -> None:
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "partitions.py":
            continue
        found = kind_decisions(path.read_text())
        if found:
            outside[str(path.relative_to(PACKAGE.parent))] = found
    assert not outside, f"partition kinds decided outside batch_assets/partitions.py (ask partition_kind(spec)): {outside}"


def test_the_detector_sees_the_branches_it_forbids() -> None:
    assert kind_decisions('if spec.partitioning.kind == "hash": pass')
    assert kind_decisions('x = part.kind in ("static", "dynamic")')
    assert kind_decisions('n = sum(d.kind == "daily" for d in dims)')
    assert kind_decisions('d = {"daily": 1, "hash": 2}')
    assert not kind_decisions('if spec.task.kind == "generate": pass')
    assert not kind_decisions('if strategy == "static": pass')


SPEC = {"name": "p", "source": {"format": "jsonl", "path": "data/{partition}.jsonl", "columns": ["text"]},
        "task": {"kind": "embed"}, "prepare": {"text_column": "text"}, "model": {"provider": "sentence_transformers"}}


@pytest.mark.parametrize(("partitioning", "path", "problem"), [
    ({"kind": "hash"}, "data/*.jsonl", "partitioning.count: hash partitioning needs count"),
    ({"kind": "hash", "count": 2}, "data/{partition}.jsonl", "hash shards read every file"),
    ({"kind": "daily"}, "data/{partition}.jsonl", "partitioning.start_date: daily partitioning needs start_date"),
    ({"kind": "daily", "start_date": "2026-01-01"}, "data/*.jsonl", "daily partitioning needs {partition} in the path"),
    ({"kind": "dynamic"}, "data/*.jsonl", "dynamic partitioning needs {partition} in the path"),
    ({"kind": "static", "keys": ["a"]}, "data/*.jsonl", "static keys are substituted for {partition}"),
    ({"kind": "static", "dimensions": []}, "data/{partition}.jsonl", "dimensions are for kind: multi, not 'static'"),
    ({"kind": "multi", "dimensions": [{"name": "app", "kind": "static", "keys": ["a"]},
                                      {"name": "day", "kind": "daily"}]}, "data/{day}/{app}.jsonl",
     "partitioning.dimensions.1.start_date: a daily dimension needs start_date"),
    ({"kind": "multi", "dimensions": [{"name": "a", "kind": "dynamic"}, {"name": "b", "kind": "dynamic"}]},
     "data/{a}/{b}.jsonl", "at most one dynamic dimension"),
])
def test_each_kind_checks_what_it_needs(partitioning: dict, path: str, problem: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec({**SPEC, "source": {**SPEC["source"], "path": path}, "partitioning": partitioning})
    assert problem in str(error.value)


def test_each_kind_resolves_the_files_a_partition_reads(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"text": "x"}\n')
    cases = {
        "static": ({"kind": "static"}, "*.jsonl", "b", ["b.jsonl"], False),
        "hash": ({"kind": "hash", "count": 2}, "*.jsonl", "shard-01-of-02", ["a.jsonl", "b.jsonl"], True),
        "dynamic": ({"kind": "dynamic"}, "{partition}.jsonl", "a", ["a.jsonl"], False),
        "daily": ({"kind": "daily", "start_date": "2026-01-01", "time_column": "text"}, "*.jsonl", "2026-01-02",
                  ["a.jsonl", "b.jsonl"], True),
    }
    for kind, (partitioning, path, key, files, filtered) in cases.items():
        spec = parse_spec({**SPEC, "source": {**SPEC["source"], "path": str(tmp_path / path)},
                           "partitioning": partitioning})
        assert partition_kind(spec) is KINDS[kind]
        part = resolve_partition(spec, key)
        assert [Path(f).name for f in part.files] == files and (part.row_filter is not None) == filtered, kind
