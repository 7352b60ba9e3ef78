"""A user's own model class, declared by import path: the `@daft.cls` / Ray `map_batches(Predictor)` pattern.

The class is instantiated once per process (in `setup_for_execution`, like every provider) and its batch method is
called on slices of `batch_size` rows, each as a dict of column name -> list. Whatever it returns is checked to be
exactly one output per input row before it goes anywhere near the sink.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batch_assets.resources.fields import operational, semantic
from batch_assets.resources.base import ModelResource, resolve_device
from batch_assets.resources.custom.loading import ImportPathError, accepts_parameter, import_object, \
    source_files
from batch_assets.resources.custom.batch_returns import Columns, as_list, concat_outputs, normalize_output


class BatchPredictionError(RuntimeError):
    """The user's batch method raised; the message names the class, the method and the rows."""


@dataclass
class _Loaded:
    instance: Any
    call: Any
    device: str | None  # what was passed to the class, None when it takes no `device`


class CustomModelProvider(ModelResource):
    """Runs any Python class with a batch method: `Class(**init_kwargs)` once per process, then `method(batch)`."""

    class_path: str = semantic(
        description="Import path of the class, 'package.module:ClassName'. The package must be installed where the "
        "pipeline runs (your project, or the worker image). A factory function returning the instance also works."
    )
    init_kwargs: dict[str, Any] = semantic(
        default_factory=dict,
        description="Keyword arguments for the constructor (model name, thresholds, ...). Use {env: NAME} in the "
        "pipeline spec for secrets. Set the device with `device`, not here.",
    )
    batch_size: int = operational(
        default=256,
        ge=1,
        description="Rows per call of the batch method. Models that sort or pad a call (sentence-transformers) run "
        "faster on hundreds of rows per call than on tens; lower it when one call's activations do not fit memory.",
    )
    device: str = operational(
        default="auto",
        description="'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', ... Passed as `device=` when the class's "
        "constructor has a `device` parameter; with 'auto' a class without one picks its own device.",
    )
    method: str = semantic(
        default="__call__",
        description="Name of the batch method: it takes a dict of column -> list and returns a list, an array, or a "
        "dict of output columns, with one value per input row.",
    )

    def model_name(self) -> str:
        return self.class_path

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(class_path=self.class_path, method=self.method, init_kwargs=sorted(self.init_kwargs))
        if self._model is not None and self._model.device is not None:
            out["device"] = self._model.device
        return out

    def user_code_files(self) -> list[str]:
        return source_files(self.class_path)

    def load(self) -> _Loaded:
        factory = import_object(self.class_path, "class_path")
        if not callable(factory):
            raise ImportPathError(
                f"class_path {self.class_path!r} names a {type(factory).__name__}, not a class: point it at the "
                "class (or a factory function) that builds your model"
            )
        kwargs = dict(self.config_value("init_kwargs"))
        if "device" in kwargs:
            raise ValueError(
                f"{self.class_path}: set the device with the provider's `device` field, not init_kwargs['device']"
            )
        device: str | None = None
        if accepts_parameter(factory, "device"):
            device = _resolve(self.device)
            kwargs["device"] = device
        elif self.device != "auto":
            raise ValueError(
                f"{self.class_path}: device={self.device!r} is set but the constructor has no `device` parameter. "
                "Add one (def __init__(self, ..., device='cpu')) or leave device='auto'."
            )
        try:
            instance = factory(**kwargs)
        except TypeError as exc:
            raise TypeError(
                f"{self.class_path}(**{sorted(kwargs)}) failed: {exc}. Check init_kwargs against the constructor."
            ) from exc
        call = getattr(instance, self.method, None)
        if not callable(call):
            raise AttributeError(
                f"{self.class_path} has no callable method {self.method!r}: set `method` to the name of the batch "
                "method (default '__call__')"
            )
        return _Loaded(instance=instance, call=call, device=device)

    @property
    def instance(self) -> Any:
        """The user's object, for tests and for classes with more than one method."""
        return self.loaded.instance

    def predict(self, batch: dict[str, list[Any]]) -> Columns:
        """Call the batch method on `batch_size`-row slices and join the results (a list, or a dict of lists)."""
        loaded = self.loaded
        source = f"{self.class_path}" if self.method == "__call__" else f"{self.class_path}.{self.method}"
        columns = {name: as_list(values, what=f"input column {name!r}") for name, values in batch.items()}
        rows = _row_count(columns, source)
        parts: list[Columns] = []
        for start in range(0, rows, self.batch_size):
            stop = min(start + self.batch_size, rows)
            piece = {name: values[start:stop] for name, values in columns.items()}
            try:
                result = loaded.call(piece)
            except Exception as exc:
                raise BatchPredictionError(
                    f"{source} failed on rows {start}..{stop - 1} of a chunk of {rows}: {type(exc).__name__}: {exc}"
                ) from exc
            parts.append(normalize_output(result, source=source, rows=stop - start))
        return concat_outputs(parts, source=source)


def _row_count(columns: dict[str, list[Any]], source: str) -> int:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"input columns for {source} have different lengths: {lengths}")
    return next(iter(lengths.values()), 0)


def _resolve(device: str) -> str:
    try:
        return resolve_device(device)
    except ImportError:  # 'auto' without torch installed: a torch-free class runs on the CPU
        return "cpu"
