"""docs/spec-reference.md is generated from the spec's own pydantic schema and must equal what the generator prints
now: a field added, renamed or re-described in the code without regenerating the page fails here (issue 14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from batch_assets.spec import PipelineSpec

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "spec-reference.md"
REGENERATE = ".venv/bin/python -m batch_assets.spec_reference > docs/spec-reference.md"


def test_the_committed_reference_page_is_what_the_generator_prints() -> None:
    printed = subprocess.run([sys.executable, "-m", "batch_assets.spec_reference"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    assert PAGE.read_text(encoding="utf-8") == printed, f"docs/spec-reference.md is stale: run `{REGENERATE}`"


def test_the_page_names_every_field_of_every_spec_section() -> None:
    page = PAGE.read_text(encoding="utf-8")

    def fields(model: type, path: str) -> list[str]:
        out = []
        for name, info in model.model_fields.items():
            out.append(f"{path}{name}")
            inner = [a for a in getattr(info.annotation, "__args__", ()) if isinstance(a, type)] + [info.annotation]
            for kind in inner:
                if isinstance(kind, type) and hasattr(kind, "model_fields"):
                    out += fields(kind, f"{path}{name}.")
        return out

    names = fields(PipelineSpec, "")
    assert {"prepare.duplicate_ids", "task.structured.on_unparseable", "partitioning.time_column"} <= set(names)
    for dotted in names:
        assert f"| `{dotted.rsplit('.', 1)[-1]}` |" in page, dotted
    assert "(concepts.md)" in page and "spec-reference.md" in (ROOT / "docs" / "concepts.md").read_text()
