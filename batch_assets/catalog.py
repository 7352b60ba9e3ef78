"""The pipeline catalog: the one place that knows where a code location's pipelines are declared, asked by every
entry point (the code location in batch_assets/definitions.py, the commands in batch_assets/commands/, the tests).

Pipelines are declared two ways ([docs/adding-a-pipeline.md](../docs/adding-a-pipeline.md)): spec files in a folder
(batch_assets/pipelines/, or the folders of $BATCH_PIPELINES_DIR, which then replace both built-in places) and
Dagster Components (`BatchInferencePipeline` defs.yaml files: batch_assets/defs/, or a user's own project's defs
folder). The catalog reads specs only: it validates them (a Component's templating rendered, its relative paths
anchored) but builds no asset, so a command that needs one pipeline's spec pays for reading YAML, not for building
every pipeline of the code location.

A pipeline declared in Python in a user's definitions.py (not as a file or a Component) is found by loading that
code location in full, as Dagster does (`code_location_specs`), the last resort of `for_project`.
"""

from __future__ import annotations

import os
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

import batch_assets.defs as built_in_defs_package
from batch_assets.components.pipeline import BatchInferencePipeline
from batch_assets.orchestration.assets.factory import pipeline_specs
from batch_assets.spec import PipelineSpec, SpecError, load_spec

PIPELINES_DIR = Path(__file__).parent / "pipelines"
COMPONENTS_DIR = Path(built_in_defs_package.__file__).parent
PIPELINES_DIR_ENV = "BATCH_PIPELINES_DIR"
DEFAULT_MODULE = "batch_assets.definitions"  # this package's code location


class UnknownPipelineError(SpecError):
    """No pipeline of that name where the catalog looked."""


@dataclass(frozen=True)
class BrokenSpec:
    origin: str  # the spec file, or the folder of Components that did not load
    error: str


@dataclass
class PipelineCatalog:
    """Every pipeline found in one place, by name: `files` (spec files) and `components` (pipeline Components of
    `tree`, which the code location builds through Dagster, so `dg list defs` names each asset's defs.yaml);
    `broken` holds what was declared but did not load, each with its error. `fallback` (a user's project) finds the
    pipelines declared some other way, asked only for a name the catalog does not have."""

    files: list[PipelineSpec]
    components: list[PipelineSpec] = field(default_factory=list)
    broken: list[BrokenSpec] = field(default_factory=list)
    where: str = ""  # what was searched, for the error that names none
    tree: dg.ComponentTree | None = None
    fallback: Callable[[], list[PipelineSpec]] | None = None

    @property
    def specs(self) -> list[PipelineSpec]:
        return [*self.files, *self.components]

    def names(self) -> list[str]:
        return sorted(s.name for s in self.specs)

    def get(self, name: str) -> PipelineSpec:
        for spec in self.specs:
            if spec.name == name:
                return spec
        if self.fallback is not None:
            taken = set(self.names())  # once: the code location is loaded in full at most one time
            self.files += [s for s in self.fallback() if s.name not in taken]  # built by that code location itself
            self.fallback = None
            return self.get(name)
        broken = "".join(f"\n  not loaded: {b.origin}: {b.error}" for b in self.broken)
        raise UnknownPipelineError(f"unknown pipeline {name!r} in {self.where}; known: "
                                   f"{', '.join(self.names()) or 'none'}{broken}")


def spec_folders() -> list[Path]:
    """$BATCH_PIPELINES_DIR's folders (os.pathsep-separated) if set, else batch_assets/pipelines/."""
    extra = os.environ.get(PIPELINES_DIR_ENV)
    # absolute (a relative folder is the shell's: against the cwd), so a broken spec's error names the file in full
    return [Path(p).expanduser().resolve() for p in extra.split(os.pathsep) if p] if extra else [PIPELINES_DIR]


def folder_specs(folders: list[Path]) -> tuple[list[PipelineSpec], list[BrokenSpec]]:
    """Every valid spec file of the folders, and every file that is not one (each with its error). Names must be
    unique: a second spec with a name already taken is broken, the first keeps working."""
    found, broken = _read_folders(folders)
    return list(found.values()), broken


def _read_folders(folders: list[Path]) -> tuple[dict[str, PipelineSpec], list[BrokenSpec]]:
    """{spec file: spec} in folder and file order, and the broken files."""
    found: dict[str, PipelineSpec] = {}
    broken: list[BrokenSpec] = []
    taken: dict[str, str] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*.yaml")):
            try:
                spec = load_spec(path)
            except SpecError as exc:
                broken.append(BrokenSpec(str(path), str(exc)))
                continue
            if spec.name in taken:
                broken.append(BrokenSpec(str(path), f"pipeline names must be unique: {spec.name!r} is already "
                                                    f"defined in {taken[spec.name]}; rename one of them"))
                continue
            taken[spec.name] = str(path)
            found[str(path)] = spec
    return found, broken


def built_in_component_tree() -> dg.ComponentTree:
    """The Components of batch_assets/defs/, from the package itself: no pyproject.toml needed, so they load from an
    installed wheel as from the checkout (ComponentTree.for_project looks for the project's config file, which
    site-packages does not have)."""
    return dg.ComponentTree.from_module(defs_module=built_in_defs_package, project_root=PIPELINES_DIR.parents[1])


def component_specs(tree: dg.ComponentTree) -> list[PipelineSpec]:
    """The spec of every pipeline Component of the tree, loaded (templates rendered, paths anchored) but not built;
    other components of the tree are not even loaded."""
    with warnings.catch_warnings():  # Dagster's own preview/beta calls inside the loader, as load_from_defs_folder hides
        warnings.simplefilter("ignore", dg.BetaWarning)
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [component.spec for component in tree.get_all_components(of_type=BatchInferencePipeline)]


def load_error(exc: BaseException) -> str:
    """Dagster's message shows which defs.yaml failed; the innermost cause says why."""
    root = exc
    while root.__cause__ or root.__context__:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    return f"{exc}\n{type(root).__name__}: {root}" if root is not exc else str(exc)


def built_in() -> PipelineCatalog:
    """This package's code location (batch_assets.definitions): the spec folders, and batch_assets/defs/'s Components
    unless $BATCH_PIPELINES_DIR names the folders to use instead."""
    folders = spec_folders()
    found, broken = _read_folders(folders)
    files = list(found.values())
    where = ", ".join(str(f) for f in folders)
    if PIPELINES_DIR_ENV in os.environ:
        return PipelineCatalog(files, broken=broken, where=where)
    where += f" and the Components of {COMPONENTS_DIR}"
    tree = built_in_component_tree()
    try:
        components = component_specs(tree)
    except Exception as exc:  # a broken defs.yaml: reported like a broken spec file, never swallowed
        broken.append(BrokenSpec(str(COMPONENTS_DIR), f"the component pipelines did not load: {load_error(exc)}"))
        return PipelineCatalog(files, broken=broken, where=where)
    # Dagster builds the component folder as one unit: a name declared twice keeps the Component, the file is broken
    declared = {s.name for s in components}
    for path, spec in found.items():
        if spec.name in declared:
            broken.append(BrokenSpec(path, f"pipeline names must be unique: {spec.name!r} is also declared as a "
                                           f"Component in {COMPONENTS_DIR}; rename one of them"))
    return PipelineCatalog([s for s in files if s.name not in declared], components, broken, where, tree)


def code_location_module(where: Path) -> str:
    """The module Dagster loads the code location from: the project's `[tool.dg.project]` in the nearest
    pyproject.toml (`code_location_target_module`, else `<root_module>.definitions`), else this package's."""
    project = _dg_project(where)
    if project is None:
        return DEFAULT_MODULE
    if project[1].get("code_location_target_module"):
        return str(project[1]["code_location_target_module"])
    return f"{project[1]['root_module']}.definitions" if project[1].get("root_module") else DEFAULT_MODULE


def for_project(where: Path, module: str = "") -> PipelineCatalog:
    """The pipelines of the code location of the project `where` is in (or of `module`): this package's own
    catalog for batch_assets.definitions; for a user's project, the pipeline Components of its defs folder, and,
    asked for a name they do not have, every pipeline of its code location loaded in full as Dagster loads it."""
    module = module or code_location_module(where)
    if module == DEFAULT_MODULE:
        return built_in()
    project = _dg_project(where)
    specs: list[PipelineSpec] = []
    found = f"the code location {module}"
    if project is not None:  # $BATCH_PIPELINES_DIR is about this package's pipelines, not a project's Components
        try:
            specs = component_specs(dg.ComponentTree.for_project(project[0]))
            found = f"the Components of {project[0]} and {found}"
        except Exception:  # noqa: BLE001 - no defs module, or one that does not load: the code location, loaded in
            specs = []     # full below (the fallback), decides, and fails with Dagster's own error if it cannot load
    return PipelineCatalog([], specs, where=found, fallback=lambda: code_location_specs(module, where))


def code_location_specs(module: str, working_directory: Path) -> list[PipelineSpec]:
    """Every pipeline of a code location, however declared: the module's definitions loaded by Dagster's own loader
    (what `dagster dev -m` and `dg` load: a `Definitions` object, or a `@dg.definitions` function, which a
    `create-dagster` project has), each pipeline read back from the metadata `build_pipeline_definitions` records."""
    from dagster._core.definitions.reconstruct import repository_def_from_target_def  # Dagster's loader, internal
    from dagster._core.workspace.autodiscovery import loadable_targets_from_python_module

    specs: list[PipelineSpec] = []
    for target in loadable_targets_from_python_module(module, working_directory=str(working_directory)):
        repository = repository_def_from_target_def(target.target_definition)
        if repository is not None:
            specs += pipeline_specs(dg.Definitions(metadata=dict(repository.metadata or {})))
    return specs


def _dg_project(where: Path) -> tuple[Path, dict] | None:
    """(folder, [tool.dg.project]) of the nearest pyproject.toml that has one."""
    for folder in (where, *where.parents):
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            project = tomllib.loads(pyproject.read_text()).get("tool", {}).get("dg", {}).get("project")
            if project is not None:
                return folder, project
    return None
