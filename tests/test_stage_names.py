"""One name per stage/asset pair (batch_assets/stage_names.py): the assets users see keep their names, and the code
names them through the table, never as string literals that could drift apart."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster as dg

from batch_assets.orchestration.assets.factory import build_pipeline_assets
from batch_assets.stage_names import ASSET_NAMES, STAGES
from batch_assets.stages import infer, prepare, read, write
from tests.conftest import EMBED_SPEC, make_spec

ROOT = Path(__file__).resolve().parents[1]


def test_the_asset_names_users_have_published_never_change(tmp_path: Path) -> None:
    # Asset keys in every user's Dagster instance, storage folders and lineage records: renaming one would make
    # every published partition look missing, and pay for it again.
    assert ASSET_NAMES == ("raw", "prepared", "inferred", "output")
    spec = make_spec(EMBED_SPEC, tmp_path)
    assets = build_pipeline_assets(spec)
    assert [a.key for a in assets] == [dg.AssetKey([spec.name, name]) for name in ASSET_NAMES]
    assert [a.metadata_by_key[a.key]["stage"] for a in assets] == list(ASSET_NAMES)
    deps = [[d.asset_key for d in a.specs_by_key[a.key].deps] for a in assets]
    assert deps[1:] == [[dg.AssetKey([spec.name, name])] for name in ASSET_NAMES[:-1]]  # each reads the one before


def test_each_stage_verb_is_its_run_function() -> None:
    modules = {"read": read, "prepare": prepare, "infer": infer, "write": write}
    assert [s.verb for s in STAGES] == list(modules)
    for stage in STAGES:
        assert callable(getattr(modules[stage.verb], f"run_{stage.verb}"))


def _literal_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants equal to an asset name used as a value (an argument, a default, a comparison, an element
    of a tuple, list or dict, an assignment): prose that happens to contain the word is not a use."""
    found = []
    for node in ast.walk(tree):
        values: list[ast.AST] = []
        if isinstance(node, ast.Call):
            values = [*node.args, *(k.value for k in node.keywords)]
        elif isinstance(node, ast.arguments):
            values = [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
        elif isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = list(node.elts)
        elif isinstance(node, ast.Dict):
            values = [k for k in node.keys if k is not None]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)) and node.value is not None:
            values = [node.value]
        for value in values:
            if isinstance(value, ast.Constant) and value.value in ASSET_NAMES:
                found.append((value.lineno, value.value))
    return found


def test_no_module_spells_an_asset_name_itself() -> None:
    offenders = []
    for path in sorted((ROOT / "batch_assets").rglob("*.py")):
        if path.name == "stage_names.py":
            continue
        for line, name in _literal_uses(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(ROOT)}:{line} {name!r}")
    assert not offenders, "name the stage through batch_assets/stage_names.py: " + ", ".join(offenders)
