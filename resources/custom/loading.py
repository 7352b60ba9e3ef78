"""Importing a user's class or factory from an import path ("package.module:Name") with errors that say what to do.

Shared by the custom-class provider and the image provider's `torch_module` option.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any


class ImportPathError(ImportError):
    """An import path in a provider's config does not resolve; the message names the path and the fix."""


def split_import_path(path: str, field: str) -> tuple[str, str]:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        raise ImportPathError(
            f"{field} {path!r} must look like 'package.module:ClassName' (a module path, a colon, then the name "
            "defined in that module)"
        )
    return module, attr


def import_object(path: str, field: str = "class_path") -> Any:
    """Resolve 'package.module:Name' (Name may be dotted: 'module:Outer.Inner')."""
    module_name, attr = split_import_path(path, field)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ImportPathError(
                f"{field} {path!r}: module {module_name!r} cannot be imported ({exc}). Install the package that "
                "holds it in the environment the pipeline runs in (pip install -e . for your project, or add it to "
                "the worker image), or fix the module path."
            ) from exc
        raise ImportPathError(
            f"{field} {path!r}: module {module_name!r} was found but imports {missing!r}, which is not installed. "
            f"Install {missing!r} in the environment the pipeline runs in."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if not n.startswith("_") and inspect.isclass(vars(module)[n]))
            raise ImportPathError(
                f"{field} {path!r}: module {module_name!r} has no attribute {attr!r}. "
                f"Classes defined or imported there: {', '.join(public) or '(none)'}."
            )
        obj = getattr(obj, part)
    return obj


def source_files(*paths: str | None) -> list[str]:
    """The source files of the modules import paths ('package.module:Name') name, found without importing them;
    paths that are unset, malformed or not found are left out (the load says what is wrong with them)."""
    files = []
    for path in paths:
        if not path or ":" not in path:
            continue
        try:
            found = importlib.util.find_spec(path.partition(":")[0])
        except (ImportError, ValueError):
            continue
        if found is not None and found.origin:
            files.append(found.origin)
    return files


def accepts_parameter(func: Any, name: str) -> bool:
    """Whether calling `func` with keyword `name` is explicitly supported (a **kwargs catch-all does not count:
    passing `device` to a class that merely forwards **kwargs somewhere else would be a guess)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    param = params.get(name)
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)
