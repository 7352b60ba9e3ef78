"""The product installed as users install it: a wheel in a fresh virtualenv, not this checkout.

docs/adding-to-a-project.md is followed as written: its shell blocks are read from the page and run, its file blocks
(the user's asset, the Component's defs.yaml) are written where their first-line comment says, in a project made by
the real `create-dagster` from the registry. The one substitution: the page's `"batch-assets[...]"` requirement
points at the wheel built from this checkout (the product is not on a registry). The CPU torch pin of
constraints.txt applies, as in `make install`; uv's shared cache serves the packages.

- `test_the_wheel_installs_into_a_create_dagster_project`: the package (issue 24 item 1): dagster keeps the project's
  1.13.29, the CPU torch, no top-level `resources`/`examples_models`, `dagster.yaml` in the wheel and put into
  DAGSTER_HOME, `dg list components` lists the Component and `dg scaffold defs` finds it.
- `test_the_page_materializes_a_day_and_automation_follows_the_upstream_asset`: the page's Component on the user's
  asset, `dg check defs`, a day launched through the CLI, rows in = rows out, nothing written under site-packages,
  the asset graph's edge, and automation. It needs the relative-path and wiring work (issue 24 item 2) and the
  upstream-asset source with content versions (items 3 and 4): red until those are merged.
- `test_the_core_install_runs_an_api_pipeline_without_torch`: the core wheel alone (no extra) runs an
  OpenAI-compatible pipeline against the real llama.cpp server, and a local-model pipeline fails naming the
  pipeline and the extra to install.

BATCH_WHEEL=/path/to.whl tests a given wheel instead of building one (how the test was shown red against the
wheel of main b25b11d).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import user_env

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-to-a-project.md"
UV = Path(sys.executable).with_name("uv")
PROJECT = "reviews"  # the page's `create-dagster project` folder
PIPELINE = "review_embeddings"
DAY, NEXT_DAY = "2026-11-01", "2026-11-02"
COMPONENT_KEY = "batch_assets.components.BatchInferencePipeline"
# The page's automation test runs a dozen user processes (dg, each step in its own process under Dagster's default
# executor, a cold ONNX export): 605 s on an idle machine, past the suite's 600 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


# -- the page --------------------------------------------------------------------------------------------------------
def page_blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the page, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def shell_steps() -> list[list[str]]:
    """Each shell block's commands (comments dropped), in page order."""
    return [[line.split("  #")[0].strip() for line in body.splitlines() if line.strip() and not line.startswith("#")]
            for lang, body in page_blocks() if lang == "bash"]


def file_blocks() -> dict[str, str]:
    """The page's files: path (the block's first-line comment) -> content."""
    files = {}
    for lang, body in page_blocks():
        first, _, rest = body.partition("\n")
        if lang in ("python", "yaml") and first.startswith("# ") and "/" in first:
            files[first[2:].strip()] = rest
    return files


# The page's shell blocks, each named by a command only it has, in page order: the fixture runs all but the last,
# the automation test the last. test_the_wheel_installs_into_a_create_dagster_project checks that these are all
# the page's blocks (tests/test_docs_commands.py relies on it: PAGES_RUN_WHOLE).
STEPS = ("create-dagster project", "uv venv", "python -m batch_assets.instance", "dg list components",
         "dg scaffold defs", "dg check defs")


def step_with(command: str) -> list[str]:
    matches = [step for step in shell_steps() if any(command in line for line in step)]
    assert len(matches) == 1, f"the page has {len(matches)} shell blocks with {command!r}"
    return matches[0]


# -- running it ------------------------------------------------------------------------------------------------------
@dataclass
class Shell:
    """A user's shell following the page: each block runs in bash, after the `cd`, `source` and `export` lines of the
    blocks before it (what a terminal keeps between commands)."""

    home: Path  # where the page's first command runs
    wheel: Path
    env: dict[str, str]
    state: list[str] = field(default_factory=list)

    def run(self, commands: list[str], timeout: int = 600, stdout_only: bool = False) -> str:
        script = "\n".join(["set -euo pipefail", f"cd {self.home}", *self.state,
                            *(self.with_wheel(c) for c in commands)])
        proc = subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, (f"the page's commands failed:\n{chr(10).join(commands)}\n--- stdout\n"
                                      f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}")
        self.state += [c for c in commands if c.split()[0] in ("cd", "source", "export")]
        return proc.stdout if stdout_only else proc.stdout + proc.stderr

    def with_wheel(self, command: str) -> str:
        return re.sub(r'"batch-assets(\[[\w,]+\])?"', lambda m: f'"batch-assets{m.group(1) or ""} @ {self.wheel.as_uri()}"',
                      command)

    @property
    def project(self) -> Path:
        return self.home / PROJECT

    @property
    def python(self) -> Path:
        return self.project / ".venv" / "bin" / "python"

    def site_packages(self) -> Path:
        return next((self.project / ".venv" / "lib").glob("python3*/site-packages"))


def page_env(tmp: Path) -> dict[str, str]:
    """A user's shell, not this checkout's: no virtualenv of ours on PATH (only uv, as a user has it), uv using the
    machine's wheels and this repository's CPU torch pin (as `make install` does), no managed-Python download."""
    tools = tmp / "tools"
    tools.mkdir(exist_ok=True)
    for name in ("uv", "uvx"):
        (tools / name).symlink_to(UV.with_name(name))
    ours = str(Path(sys.executable).parent)
    path = os.pathsep.join([str(tools)] + [p for p in os.environ["PATH"].split(os.pathsep) if p != ours])
    env = user_env()
    for key in ("VIRTUAL_ENV", "BATCH_PIPELINES_DIR", "BATCH_STORAGE_ROOT", "DAGSTER_HOME", "PYTHONPATH", "UV_PYTHON"):
        env.pop(key, None)
    find_links = env.get("UV_FIND_LINKS") or env.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout.strip()
    # UV_PYTHON stays unset (popped above): set, it would make `uv pip install` target that interpreter instead of
    # the virtualenv the page activates.
    # PYTHONDONTWRITEBYTECODE, which this machine kind sets and a user's shell does not: with it, and uv installing
    # no .pyc files, every `dg` and step process compiled torch, transformers and Dagster from source again (a
    # one-row `dg launch` of the user's own asset ran over 2 minutes). A user's Python writes them on first import.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(PATH=path, UV_CONSTRAINT=str(ROOT / "constraints.txt"), UV_PYTHON_DOWNLOADS="never")
    if find_links:
        env["UV_FIND_LINKS"] = find_links
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("BATCH_WHEEL")
    if given:
        return Path(given).resolve()
    # built from a copy of what the package is made of: setuptools writes build/ and *.egg-info into the source tree,
    # and the suite never writes under the checkout
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "dagster.yaml"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("batch_assets", "resources"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([str(UV), "build", "--wheel", "-o", str(out), str(source)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(out.glob("batch_assets-*.whl"))


@dataclass
class Installed:
    shell: Shell
    dagster_pinned: str  # what create-dagster's pyproject.toml pins
    dagster_after_install: str
    listing_before_runs: dict[str, int]
    component_list: str


def listing(folder: Path) -> dict[str, int]:
    """Every file under `folder` with its size; Python's own bytecode caches left out (any import writes them)."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The page up to and including `dg scaffold defs` (steps 1 to 5)."""
    tmp = tmp_path_factory.mktemp("user")
    shell = Shell(tmp, wheel, page_env(tmp))
    shell.run(step_with("create-dagster project"))
    pinned = re.search(r'"dagster==([\d.]+)"', (shell.project / "pyproject.toml").read_text())
    assert pinned, "create-dagster's project no longer pins dagster exactly: update the page and this test"
    files = file_blocks()
    asset_file = next(p for p in files if p.endswith("raw_app_reviews.py"))
    (shell.project / asset_file).write_text(files[asset_file])
    out = shell.run(step_with("uv venv"))
    dagster_version = re.findall(r"dagster, version (\S+)", out)
    shell.run(step_with("python -m batch_assets.instance"))
    components = shell.run(step_with("dg list components"))
    shell.run(step_with("dg scaffold defs"))
    return Installed(shell, pinned.group(1), dagster_version[-1] if dagster_version else out[-2000:], listing(shell.site_packages()),
                     components)


def test_the_wheel_installs_into_a_create_dagster_project(installed: Installed) -> None:
    shell = installed.shell
    # the project create-dagster made pins dagster exactly; installing the product with its `local` extra kept it
    assert installed.dagster_after_install == installed.dagster_pinned, (
        f"installing batch-assets[local] moved the project's dagster=={installed.dagster_pinned} to "
        f"{installed.dagster_after_install}")
    created = subprocess.run([str(UV), "pip", "list", "--format", "json", "-p", str(shell.python)],
                             capture_output=True, text=True, env=shell.env).stdout
    versions = {p["name"].lower(): p["version"] for p in json.loads(created)}
    assert versions["torch"].endswith("+cpu"), versions["torch"]  # the CPU build, kept by the constraint
    site = shell.site_packages()
    # one import name: nothing that collides with a user's `resources` or `examples_models` module; what the wheel put
    # into site-packages (its RECORD) is the package and its metadata, built-in pipeline specs included
    assert not (site / "resources").exists() and not (site / "examples_models").exists()
    record = next(site.glob("batch_assets-*.dist-info")) / "RECORD"
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines() if line}
    assert {t for t in tops if not t.startswith("batch_assets-")} == {"batch_assets"}, tops
    assert (site / "batch_assets" / "pipelines" / "document_embeddings.yaml").is_file()
    assert (site / "batch_assets" / "resources" / "registry.py").is_file()
    # the instance config ships in the wheel, and the page's command put it into DAGSTER_HOME unchanged
    assert (site / "batch_assets" / "dagster.yaml").read_bytes() == (ROOT / "dagster.yaml").read_bytes()
    assert (shell.project / ".dagster_home" / "dagster.yaml").read_bytes() == (ROOT / "dagster.yaml").read_bytes()
    # dg finds the Component through the package's entry point, and scaffolds it in the user's defs folder
    assert COMPONENT_KEY in installed.component_list, installed.component_list[-3000:]
    # every shell block of the page is one of the steps this module runs, in order
    assert [step_with(name) for name in STEPS] == shell_steps()
    scaffolded = shell.project / "src" / PROJECT / "defs" / PIPELINE / "defs.yaml"
    assert f"type: {COMPONENT_KEY}" in scaffolded.read_text()


def _state(shell: Shell, cursor_file: Path, evaluate: bool) -> dict:
    script = AUTOMATION_SCRIPT.format(project=PROJECT, pipeline=PIPELINE, cursor=str(cursor_file), evaluate=evaluate)
    proc = subprocess.run([str(shell.python), "-c", script], cwd=shell.project, capture_output=True, text=True,
                          timeout=300, env={**shell.env, "DAGSTER_HOME": str(shell.project / ".dagster_home")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("STATE", 1)[1])


AUTOMATION_SCRIPT = """
import json
from pathlib import Path
import dagster as dg
from dagster._serdes import deserialize_value, serialize_value

import {project}.definitions as code_location  # the project's own definitions, as `dg` loads them

defs = code_location.defs if isinstance(code_location.defs, dg.Definitions) else code_location.defs()
instance = dg.DagsterInstance.get()
out = {{"requests": []}}
if {evaluate}:
    cursor_file = Path({cursor!r})
    cursor = deserialize_value(cursor_file.read_text()) if cursor_file.exists() else None
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
    cursor_file.write_text(serialize_value(result.cursor))
    keys = [k for k in defs.resolve_asset_graph().get_all_asset_keys() if k.path[0] == "{pipeline}"]
    out["requests"] = [{{"key": k.to_user_string(), "partition": p}}
                       for k in keys for p in sorted(result.get_requested_partitions(k))]
records = instance.fetch_materializations(dg.AssetKey(["{pipeline}", "inferred"]), limit=100).records
out["inferred"] = [{{"partition": r.partition_key, "metadata": sorted(r.asset_materialization.metadata)}}
                   for r in records]
print("STATE" + json.dumps(out))
"""


def _launch_requested(shell: Shell, state: dict, partition: str) -> list[str]:
    """Launch, through the CLI, the product's assets the automation asked for on `partition` (the daemon's job)."""
    keys = sorted({r["key"] for r in state["requests"] if r["partition"] == partition})
    if keys:
        shell.run([f"dg launch --assets {','.join(keys)} --partition {partition}"])
    return keys


def test_the_page_materializes_a_day_and_automation_follows_the_upstream_asset(installed: Installed) -> None:
    """Red until issue 24 items 2-4 are merged (wiring and relative paths; the upstream-asset source; content
    versions): the page's Component uses `source.asset` and a path relative to the user's project."""
    shell = installed.shell
    files = file_blocks()
    component = next(p for p in files if p.endswith(f"{PIPELINE}/defs.yaml"))
    (shell.project / component).write_text(files[component])
    out = shell.run(step_with("dg check defs"))
    assert "All definitions loaded successfully" in out

    # a day through the CLI: every row of the upstream file comes out once, in the user's project folder
    source = shell.project / "data" / "raw_app_reviews" / f"{DAY}.jsonl"
    ids_in = [json.loads(line)["review_id"] for line in source.read_text().splitlines()]
    output = shell.project / "data" / "storage" / PIPELINE / "output" / f"{DAY}.parquet"
    table = pq.read_table(output)
    assert len(ids_in) == 24 and sorted(table.column("review_id").to_pylist()) == sorted(ids_in)
    assert table.column("error").null_count == table.num_rows
    # nothing was written under site-packages by the install's users: the runs, the checks, the Component
    assert listing(shell.site_packages()) == installed.listing_before_runs

    # the asset graph: the user's asset is upstream of the product's first asset
    listed = json.loads(shell.run(["dg list defs --json"], stdout_only=True))
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert "raw_app_reviews" in assets[f"{PIPELINE}/raw"]["dependency_keys"], assets[f"{PIPELINE}/raw"]

    # automation: materializing the user's asset makes the product's assets run for that day ...
    cursor = shell.home / "automation-cursor"
    _state(shell, cursor, evaluate=True)  # the first tick: Dagster's baseline
    shell.run([f"dg launch --assets raw_app_reviews --partition {NEXT_DAY}"])
    state = _state(shell, cursor, evaluate=True)
    assert _launch_requested(shell, state, NEXT_DAY), f"nothing requested after raw_app_reviews {NEXT_DAY}: {state}"
    next_output = shell.project / "data" / "storage" / PIPELINE / "output" / f"{NEXT_DAY}.parquet"
    assert pq.read_table(next_output).num_rows == 24

    # ... and materializing it again with byte-identical output pays nothing: no run, or a run whose stages skip
    before = source.with_name(f"{NEXT_DAY}.jsonl").read_bytes()
    shell.run([f"dg launch --assets raw_app_reviews --partition {NEXT_DAY}"])
    assert source.with_name(f"{NEXT_DAY}.jsonl").read_bytes() == before
    state = _state(shell, cursor, evaluate=True)
    made = [r for r in state["inferred"] if r["partition"] == NEXT_DAY]
    assert len(made) == 1 and "skipped" not in made[0]["metadata"], made  # the automation's run inferred, once
    if _launch_requested(shell, state, NEXT_DAY):
        state = _state(shell, cursor, evaluate=False)
    again = [r for r in state["inferred"] if r["partition"] == NEXT_DAY]
    paid = [r for r in again if "skipped" not in r["metadata"]]
    assert len(paid) == 1, f"the identical day was inferred {len(paid)} times: {again}"
    assert listing(shell.site_packages()) == installed.listing_before_runs


def test_the_core_install_runs_an_api_pipeline_without_torch(wheel: Path, tmp_path: Path, llama_server) -> None:
    """`pip install batch-assets` alone (no extra): an OpenAI-compatible pipeline runs against the real llama.cpp
    server through Dagster's CLI, with no torch in the environment; a local-model pipeline in the same code location
    fails its run naming the pipeline and the extra to install. Absolute paths: this is about the install, not path
    resolution."""
    env = page_env(tmp_path)
    venv = tmp_path / "core"
    for command in ([str(UV), "venv", str(venv)], [str(UV), "pip", "install", "-p", str(venv / "bin" / "python"),
                                                    f"batch-assets @ {wheel.as_uri()}"]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    site = next((venv / "lib").glob("python3*/site-packages"))
    missing = [m for m in ("torch", "transformers", "sentence_transformers", "openvino", "dagster_k8s", "kubernetes",
                           "s3fs", "lancedb", "dagster_dg_cli") if (site / m).exists()]
    assert missing == [], f"the core install brought {missing}"

    rows = [{"qid": f"q{i}", "question": q} for i, q in enumerate(["Is the sky blue?", "Is fire cold?", "Is ice hot?"])]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = tmp_path / "specs"
    specs.mkdir()
    common = {"source": {"format": "jsonl", "path": f"{tmp_path}/data/{{partition}}.jsonl",
                         "columns": ["qid", "question"]},
              "partitioning": {"kind": "static", "keys": ["part-0"]}}
    (specs / "api_answers.yaml").write_text(yaml.safe_dump({
        "name": "api_answers", **common,
        "prepare": {"id_column": "qid", "template": "Answer yes or no: {question}"},
        "task": {"kind": "generate", "output_column": "answer", "params": {"max_new_tokens": 4, "temperature": 0}},
        "model": {"provider": "openai", "config": {"model": "smollm2", "base_url": llama_server.base_url}},
        "sink": {"format": "parquet", "columns": ["qid", "answer", "error"]}}))
    (specs / "local_embeddings.yaml").write_text(yaml.safe_dump({
        "name": "local_embeddings", **common,
        "prepare": {"id_column": "qid", "text_column": "question"}, "task": {"kind": "embed"},
        "model": {"provider": "sentence_transformers"},
        "sink": {"format": "parquet", "columns": ["qid", "embedding", "error"]}}))
    home = tmp_path / "home"
    home.mkdir()
    run_env = {**env, "BATCH_PIPELINES_DIR": str(specs), "BATCH_STORAGE_ROOT": str(tmp_path / "store"),
               "DAGSTER_HOME": str(home)}

    def materialize(group: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "dagster"), "asset", "materialize", "-m", "batch_assets.definitions",
                               "--select", f"group:{group}", "--partition", "part-0"], cwd=tmp_path, env=run_env,
                              capture_output=True, text=True, timeout=300)

    api = materialize("api_answers")
    assert api.returncode == 0, api.stdout[-3000:] + api.stderr[-3000:]
    table = pq.read_table(tmp_path / "store" / "api_answers" / "output" / "part-0.parquet")
    assert sorted(table.column("qid").to_pylist()) == ["q0", "q1", "q2"]
    assert table.column("error").null_count == 3 and all(table.column("answer").to_pylist())

    local = materialize("local_embeddings")
    assert local.returncode != 0
    said = local.stdout + local.stderr
    assert "pipeline 'local_embeddings'" in said and 'pip install "batch-assets[local]"' in said, [
        line for line in said.splitlines() if "local_embeddings" in line or "Error" in line][-20:]
    assert not (tmp_path / "store" / "local_embeddings" / "output").exists()
