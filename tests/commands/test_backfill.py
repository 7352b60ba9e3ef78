"""`python -m batch_assets.commands.backfill`: the pipeline found in the catalog of the project it runs in, only that
pipeline built.

In a project laid out as `create-dagster project` makes it (a `@dg.definitions` definitions.py), the command records an
asset backfill of the four assets of the pipeline its defs.yaml declares, for the partitions asked, without importing
the project's definitions.py or this package's code location; a name the project does not have is answered with
the names it has, and no backfill is recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import yaml

from tests.conftest import EMBED_SPEC
from tests.daemon_helpers import dagster_home
from tests.test_project_wiring import CREATE_DAGSTER_DEFINITIONS, _project

# The command run as `python -m`, then the modules it imported: the ones a full code location load would bring.
RUN_AND_REPORT = textwrap.dedent("""\
    import runpy, sys
    sys.argv = ["backfill", *sys.argv[1:]]
    try:
        runpy.run_module("batch_assets.commands.backfill", run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    print("IMPORTED", ",".join(m for m in ("batch_assets.definitions", "shop_bf.definitions") if m in sys.modules))
    sys.exit(code)
    """)


def _backfill(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BATCH_PIPELINES_DIR",)}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(project / "src"))
    return subprocess.run([sys.executable, "-c", RUN_AND_REPORT, *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_backfill_command_finds_a_component_pipeline_and_builds_only_it(tmp_path: Path) -> None:
    project = _project(tmp_path / "shop_bf", "shop_bf")
    (project / "src" / "shop_bf" / "definitions.py").write_text(CREATE_DAGSTER_DEFINITIONS)
    spec = {**EMBED_SPEC, "name": "shop_docs", "partitioning": {"kind": "static", "keys": ["a", "b", "c"]}}
    folder = project / "src" / "shop_bf" / "defs" / "shop_docs"
    folder.mkdir()
    (folder / "defs.yaml").write_text(yaml.safe_dump({"type": "batch_assets.components.BatchInferencePipeline",
                                                      "attributes": spec}))
    home = dagster_home(tmp_path / "home")

    proc = _backfill(project, home, "shop_docs", "--from", "b", "--to", "c")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Requested backfill" in proc.stdout and "shop_docs, 2 partition(s) b...c" in proc.stdout
    assert "IMPORTED \n" in proc.stdout  # neither the project's definitions.py nor this package's code location
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [backfill] = instance.get_backfills()
        assert set(backfill.asset_selection) == {dg.AssetKey(["shop_docs", s])
                                                 for s in ("raw", "prepared", "inferred", "output")}
        assert sorted(backfill.asset_backfill_data.target_subset.get_partitions_subset(
            dg.AssetKey(["shop_docs", "raw"])).get_partition_keys()) == ["b", "c"]

    unknown = _backfill(project, home, "nowhere", "--all")
    assert unknown.returncode == 2
    assert "unknown pipeline 'nowhere'" in unknown.stderr and "known: shop_docs" in unknown.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert len(instance.get_backfills()) == 1
