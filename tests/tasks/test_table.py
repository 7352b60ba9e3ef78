"""The task kind is decided in one place: the `TASKS` table (batch_assets/tasks/). Every other module asks the
spec's Task, so a new kind is one class plus one table entry, and no stage can drift from another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from batch_assets.spec import parse_spec
from batch_assets.tasks import TASKS, task_type
from batch_assets.resources.protocols import CAPABILITIES, supports
from batch_assets.resources.registry import PROVIDERS, provider_class

PACKAGE = Path(__file__).resolve().parents[2] / "batch_assets"
KINDS = set(CAPABILITIES)


def _kind_constants(node: ast.AST) -> set[str]:
    """Task-kind names written as constants in `node` (a string, or a tuple / list / set of strings)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_kind_constants(e) for e in node.elts)) if node.elts else set()
    return set()


def _names_a_kind(node: ast.AST) -> bool:
    """`kind`, `x.kind`, `spec.task.kind` ... anywhere in `node`."""
    return any((isinstance(n, ast.Name) and n.id == "kind") or (isinstance(n, ast.Attribute) and n.attr == "kind")
               for n in ast.walk(node))


def kind_decisions(source: str) -> list[tuple[int, str]]:
    """(line, code) of every comparison of a kind against a task kind's name, and of every dict keyed by two or more
    task kinds. (A provider method named like a kind, `method == "generate"` in the response cache, is the
    provider's capability, not a task kind.)"""
    found = []
    for node in ast.walk(ast.parse(source)):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(_kind_constants(n) for n in operands) and any(_names_a_kind(n) for n in operands):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict) and len({k.value for k in node.keys
                                                 if isinstance(k, ast.Constant) and k.value in KINDS}) >= 2:
            found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_table_has_one_task_per_capability() -> None:
    assert set(TASKS) == KINDS
    for kind, task in TASKS.items():
        assert task.kind == kind and CAPABILITIES[kind][1]  # each class answers for its own kind


def test_no_module_outside_the_table_decides_the_task_kind() -> None:
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "tasks" in path.parents:
            continue
        found = kind_decisions(path.read_text())
        if found:
            outside[str(path.relative_to(PACKAGE.parent))] = found
    assert not outside, f"task kinds decided outside batch_assets/tasks/ (ask task_type(spec) instead): {outside}"


def test_the_detector_sees_the_branches_it_forbids() -> None:
    assert kind_decisions('if spec.task.kind == "generate": pass')
    assert kind_decisions('x = kind in ("embed", "classify")')
    assert kind_decisions('d = {"generate": ["_prompt"], "embed": ["_text"]}')
    assert not kind_decisions('if spec.partitioning.kind == "hash": pass')
    assert not kind_decisions('if method == "generate": pass')


@pytest.mark.parametrize(("task", "prepare", "inputs", "sources"), [
    ({"kind": "generate"}, {"template": "About {text}"}, ["_prompt"], ["text"]),
    ({"kind": "generate"}, {"template": "About {text}", "image_columns": ["image"]}, ["_prompt", "_images"],
     ["text", "image"]),
    ({"kind": "embed"}, {"text_column": "text"}, ["_text"], ["text"]),
    ({"kind": "classify", "labels": ["a", "b"]}, {"template": "{text} {title}"}, ["_text"], ["text", "title"]),
    ({"kind": "predict"}, {"input_columns": ["text", "image"]}, ["text", "image"], ["text", "image"]),
    ({"kind": "embed_image"}, {"image_columns": ["image"]}, ["image"], ["image"]),
    ({"kind": "transcribe", "output_column": "transcript"}, {"input_columns": ["title"]}, ["title"], ["title"]),
])
def test_the_models_input_columns_have_one_answer(task, prepare, inputs, sources) -> None:
    spec = parse_spec({
        "name": "p", "source": {"format": "jsonl", "path": "x/{partition}.jsonl", "columns": ["text", "image", "title"]},
        "partitioning": {"kind": "static", "keys": ["a"]}, "prepare": prepare, "task": task,
        "model": {"provider": next(name for name in sorted(PROVIDERS) if supports(provider_class(name), task["kind"])),
                  "config": {}},
    })
    kind = task_type(spec)
    assert kind.model_input(spec) == inputs  # the prepared columns a checkpointed chunk's inputs are digested from
    assert kind.source_columns(spec) == sources  # the source columns those are made of (previews)
