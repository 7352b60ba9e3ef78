"""CustomModelProvider: a user's class by import path, loaded once per process, checked for one output per row."""

from __future__ import annotations

import sys
import textwrap
import uuid

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from batch_assets.resources.base import LOAD_COUNTS
from batch_assets.resources.custom import BatchAlignmentError, BatchOutputTypeError, BatchPredictionError, CustomModelProvider
from batch_assets.resources.custom.loading import ImportPathError
from batch_assets.resources.provider_errors import ModelLoadError

USER_MODULE = textwrap.dedent(
    '''
    import numpy as np
    import pandas as pd
    import pyarrow as pa


    class Doubler:
        """Counts constructions at class level: the test reads it after a Dagster run."""

        instances = 0
        batch_sizes = []

        def __init__(self, factor=2):
            type(self).instances += 1
            self.factor = factor

        def __call__(self, batch):
            type(self).batch_sizes.append(len(batch["x"]))
            return [x * self.factor for x in batch["x"]]


    class DropsARow:
        def __call__(self, batch):
            return batch["x"][:-1]


    class SeveralColumns:
        def __call__(self, batch):
            xs = np.asarray(batch["x"])
            return {
                "label": np.where(xs % 2 == 0, "even", "odd"),
                "score": pd.Series(xs / 10.0),
                "echo": pa.array(batch["name"]),
            }


    class ShortColumn:
        def __call__(self, batch):
            return {"label": ["a"] * len(batch["x"]), "score": [0.5] * (len(batch["x"]) + 1)}


    class ReturnsText:
        def __call__(self, batch):
            return "positive"


    class WithDevice:
        def __init__(self, device):
            self.device = device

        def predict_batch(self, batch):
            return [self.device] * len(batch["x"])


    class Explodes:
        def __call__(self, batch):
            if 7 in batch["x"]:
                raise ValueError("cannot score 7")
            return batch["x"]
    '''
)


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """A user's package, written to disk and importable, as it would be once installed in the worker image."""
    name = f"user_models_{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("user_pkg")
    (folder / f"{name}.py").write_text(USER_MODULE)
    sys.path.insert(0, str(folder))
    yield name
    sys.path.remove(str(folder))
    sys.modules.pop(name, None)


def loaded(module: str, cls: str, **config) -> CustomModelProvider:
    return CustomModelProvider(class_path=f"{module}:{cls}", **config).load_for_tests()


def test_class_is_instantiated_once_per_process_in_a_dagster_run(user_module):
    before = LOAD_COUNTS["CustomModelProvider"]

    @dg.asset
    def doubled(model: CustomModelProvider) -> list:
        return model.predict({"x": list(range(10))})

    @dg.asset
    def doubled_again(model: CustomModelProvider, doubled: list) -> list:
        return model.predict({"x": doubled})

    provider = CustomModelProvider(class_path=f"{user_module}:Doubler", init_kwargs={"factor": 3}, batch_size=4)
    with dg.instance_for_test() as instance:
        result = dg.materialize([doubled, doubled_again], resources={"model": provider}, instance=instance)

    assert result.success
    assert result.output_for_node("doubled") == [x * 3 for x in range(10)]
    assert result.output_for_node("doubled_again") == [x * 9 for x in range(10)]
    cls = sys.modules[user_module].Doubler
    assert cls.instances == 1  # one construction for two assets and six batch calls
    assert cls.batch_sizes == [4, 4, 2, 4, 4, 2]
    assert LOAD_COUNTS["CustomModelProvider"] == before + 1


def test_a_result_with_a_missing_row_is_refused(user_module):
    provider = loaded(user_module, "DropsARow", batch_size=4)
    with pytest.raises(BatchAlignmentError) as err:
        provider.predict({"x": [1, 2, 3, 4, 5]})
    assert str(err.value) == (
        f"{user_module}:DropsARow returned 3 rows for a batch of 4: "
        "a batch method must return exactly one output per input row"
    )


def test_dict_of_columns_from_numpy_pandas_and_arrow(user_module):
    provider = loaded(user_module, "SeveralColumns", batch_size=3)
    out = provider.predict({"x": [1, 2, 3, 4, 5], "name": ["a", "b", "c", "d", "e"]})
    assert out == {
        "label": ["odd", "even", "odd", "even", "odd"],
        "score": [0.1, 0.2, 0.3, 0.4, 0.5],
        "echo": ["a", "b", "c", "d", "e"],
    }


def test_inputs_may_be_arrays_and_output_columns_are_checked_one_by_one(user_module):
    provider = loaded(user_module, "ShortColumn")
    with pytest.raises(BatchAlignmentError, match=r"returned 4 rows for a batch of 3: .*\(output column 'score'\)"):
        provider.predict({"x": np.array([1, 2, 3])})


def test_a_per_row_answer_is_not_a_column(user_module):
    provider = loaded(user_module, "ReturnsText")
    with pytest.raises(BatchOutputTypeError, match="ReturnsText is a str, not a column"):
        provider.predict({"x": pa.array([1, 2])})


def test_input_columns_of_different_lengths_are_refused(user_module):
    provider = loaded(user_module, "Doubler")
    with pytest.raises(ValueError, match="different lengths"):
        provider.predict({"x": [1, 2, 3], "y": pd.Series([1, 2])})


def test_device_auto_is_resolved_and_passed_with_a_custom_method(user_module):
    provider = loaded(user_module, "WithDevice", method="predict_batch", batch_size=2)
    assert provider.predict({"x": [1, 2, 3]}) == ["cpu"] * 3  # no GPU on these machines
    assert provider.describe()["device"] == "cpu"


def test_an_explicit_device_needs_a_device_parameter(user_module):
    with pytest.raises(ModelLoadError, match="device='cuda' is set but the constructor has no `device` parameter"):
        loaded(user_module, "Doubler", device="cuda")


def test_errors_in_the_users_method_name_the_rows(user_module):
    provider = loaded(user_module, "Explodes", batch_size=4)
    with pytest.raises(BatchPredictionError, match=r"Explodes failed on rows 4\.\.7 of a chunk of 10: ValueError"):
        provider.predict({"x": list(range(10))})


def test_describe_lists_init_kwargs_names_but_not_values(user_module):
    provider = CustomModelProvider(class_path=f"{user_module}:Doubler", init_kwargs={"factor": "s3cr3t-token"})
    meta = provider.load_for_tests().describe()
    assert meta["model"] == f"{user_module}:Doubler"
    assert meta["init_kwargs"] == ["factor"]
    assert "s3cr3t-token" not in repr(meta)


def test_a_missing_module_names_the_path_and_what_to_install():
    provider = CustomModelProvider(class_path="no_such_pkg.models:Sentiment")
    with pytest.raises(ImportPathError) as err:
        provider.load_for_tests()
    message = str(err.value)
    assert "'no_such_pkg.models:Sentiment'" in message
    assert "Install the package that holds it" in message


def test_a_malformed_path_says_what_it_should_look_like():
    with pytest.raises(ImportPathError, match="must look like 'package.module:ClassName'"):
        CustomModelProvider(class_path="batch_assets.examples.sentiment.ReviewSentiment").load_for_tests()


def test_a_missing_class_lists_what_the_module_has(user_module):
    with pytest.raises(ImportPathError) as err:
        loaded(user_module, "Tripler")
    assert f"module {user_module!r} has no attribute 'Tripler'" in str(err.value)
    assert "Doubler" in str(err.value)


def test_bad_init_kwargs_fail_the_load_with_the_class_named(user_module):
    with pytest.raises(ModelLoadError, match=rf"{user_module}:Doubler\(\*\*\['colour'\]\) failed"):
        loaded(user_module, "Doubler", init_kwargs={"colour": "red"})
