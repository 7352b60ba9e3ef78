"""batch_assets.resources.structured: the spec section, JSON schema -> Arrow types, and validation of each row's text."""

from __future__ import annotations

import json
from typing import Literal, Optional

import pyarrow as pa
import pytest
from pydantic import BaseModel, ValidationError

from batch_assets.resources.protocols import GenerationParams
from batch_assets.resources.structured import StructuredOutput, arrow_type_for, build_columns, validate_output


class Address(BaseModel):
    city: str
    postcode: Optional[str] = None


class Company(BaseModel):
    """Used through `pydantic_model: tests.resources.test_structured:Company`."""

    name: str
    employees: int
    revenue_musd: float
    public: bool
    industry: Literal["Finance", "Retail", "Other"]
    tags: list[str]
    hq: Address
    parent: Optional[str] = None


class Node(BaseModel):  # recursive: no fixed Arrow shape below the first level
    label: str
    children: list["Node"] = []


COMPANY = "tests.resources.test_structured:Company"


# -- the spec section --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "section, message",
    [
        ({}, "exactly one of"),
        ({"choices": ["a"], "regex": "a"}, "exactly one of"),
        ({"choices": []}, "is empty"),
        ({"choices": ["a", "a"]}, "duplicate"),
        ({"regex": "("}, "does not compile"),
        ({"json_schema": {"type": 5}}, "not a valid JSON schema"),
        ({"json_schema": {"type": "string"}, "unnest": True}, "unnest needs an object schema"),
        ({"pydantic_model": "no_colon"}, "package.module:ClassName"),
        ({"pydantic_model": "tests.resources.test_structured:Missing"}, "is not a pydantic BaseModel"),
        ({"pydantic_model": "no.such.module:X"}, "cannot import"),
        ({"json_schema": {"$ref": "http://example.com/s.json"}}, "is not local"),
        ({"choices": ["a"], "unknown": 1}, "Extra inputs"),
    ],
)
def test_bad_sections_are_refused_with_a_reason(section, message):
    with pytest.raises(ValidationError, match=message):
        StructuredOutput.model_validate(section)


def test_generation_constraints_fill_generation_params():
    assert StructuredOutput(choices=["yes", "no"]).generation_constraints() == {"choices": ("yes", "no")}
    assert StructuredOutput(regex=r"\d+").generation_constraints() == {"regex": r"\d+"}
    params = GenerationParams(max_new_tokens=10, **StructuredOutput(pydantic_model=COMPANY).generation_constraints())
    # the model's schema with its objects closed (additionalProperties: false, docs/structured-outputs.md)
    closed = Company.model_json_schema()
    closed["additionalProperties"] = False
    closed["$defs"]["Address"]["additionalProperties"] = False
    assert params.json_schema == closed
    assert StructuredOutput.from_params(params).resolved_json_schema() == closed
    open_params = GenerationParams(**StructuredOutput(pydantic_model=COMPANY, allow_extra_keys=True)
                                   .generation_constraints())
    assert open_params.json_schema == Company.model_json_schema()
    # a provider rebuilding the constraint from the params never closes what the spec left open
    assert StructuredOutput.from_params(open_params).resolved_json_schema() == Company.model_json_schema()
    assert StructuredOutput.from_params(GenerationParams()) is None


# -- Arrow types -------------------------------------------------------------------------------------------------------
def test_pydantic_model_maps_to_a_struct_in_declaration_order():
    t = arrow_type_for(StructuredOutput(pydantic_model=COMPANY))
    assert t == pa.struct(
        [
            ("name", pa.string()),
            ("employees", pa.int64()),
            ("revenue_musd", pa.float64()),
            ("public", pa.bool_()),
            ("industry", pa.string()),
            ("tags", pa.list_(pa.string())),
            ("hq", pa.struct([("city", pa.string()), ("postcode", pa.string())])),  # via $defs/$ref
            ("parent", pa.string()),  # Optional[str] -> anyOf [string, null]
        ]
    )


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"type": "integer"}, pa.int64()),
        ({"type": ["number", "null"]}, pa.float64()),
        ({"enum": ["a", "b"]}, pa.string()),
        ({"enum": [1, 2.5]}, pa.float64()),
        ({"type": "array", "items": {"type": "boolean"}}, pa.list_(pa.bool_())),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, pa.map_(pa.string(), pa.int64())),
        ({"type": "object"}, pa.string()),  # free-form object: JSON text
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, pa.string()),  # mixed union: JSON text
        ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, pa.float64()),
        ({"allOf": [{"type": "string"}], "description": "pydantic<2 style"}, pa.string()),
    ],
)
def test_json_schema_arrow_types(schema, expected):
    assert arrow_type_for(StructuredOutput(json_schema=schema)) == expected


def test_recursive_schema_keeps_the_recursive_part_as_json_text():
    t = arrow_type_for(StructuredOutput(json_schema=Node.model_json_schema()))
    assert t == pa.struct([("label", pa.string()), ("children", pa.list_(pa.string()))])


def test_choices_and_regex_are_strings():
    assert arrow_type_for(StructuredOutput(choices=["a"])) == pa.string()
    assert arrow_type_for(StructuredOutput(regex="a+")) == pa.string()


# -- validation --------------------------------------------------------------------------------------------------------
def test_choice_accepts_the_exact_label_after_trimming_whitespace_and_quotes():
    s = StructuredOutput(choices=["Law Firm", "Retail"])
    assert validate_output("Law Firm", s) == ("Law Firm", None)
    assert validate_output('  "Retail"\n', s) == ("Retail", None)
    for wrong in ("law firm", "Law Firm.", "Retail store", ""):
        value, error = validate_output(wrong, s)
        assert value is None and "is not one of the labels" in error


def test_regex_must_match_the_whole_output():
    s = StructuredOutput(regex=r"\d{3}-\d{4}")
    assert validate_output("555-1234", s) == ("555-1234", None)
    assert validate_output(" 555-1234\n", s) == ("555-1234", None)
    value, error = validate_output("call 555-1234", s)
    assert value is None and "does not fully match" in error


def test_json_value_is_shaped_for_its_arrow_type():
    s = StructuredOutput(pydantic_model=COMPANY, allow_extra_keys=True)  # extra keys allowed, yet never published
    text = json.dumps(
        {
            "name": "Acme",
            "employees": 12.0,  # an integral float is a valid integer
            "revenue_musd": 3,
            "public": False,
            "industry": "Retail",
            "tags": ["b2b"],
            "hq": {"city": "Oslo"},
            "unexpected": "dropped",
        }
    )
    value, error = validate_output(text, s)
    assert error is None
    assert value == {
        "name": "Acme",
        "employees": 12,
        "revenue_musd": 3.0,
        "public": False,
        "industry": "Retail",
        "tags": ["b2b"],
        "hq": {"city": "Oslo", "postcode": None},
        "parent": None,
    }
    assert pa.array([value], arrow_type_for(s)).to_pylist() == [value]
    # by default the same answer is refused: the key the schema does not list is named
    value, error = validate_output(text, StructuredOutput(pydantic_model=COMPANY))
    assert value is None and "'unexpected' was unexpected" in error and "additionalProperties" in error


def test_json_code_fence_from_an_unconstrained_model_is_accepted():
    s = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert validate_output('```json\n{"a": 1}\n```', s) == ({"a": 1}, None)


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"name": "Acme", "employees": "many"', "not valid JSON"),
        ('{"name": "Acme", "employ', "looks cut off"),
        ('{"name": "Acme"}', "'employees' is a required property"),
        ("Sure! Here is the JSON you asked for.", "not valid JSON"),
    ],
)
def test_json_errors_say_what_is_wrong(text, message):
    value, error = validate_output(text, StructuredOutput(pydantic_model=COMPANY))
    assert value is None and message in error


@pytest.mark.parametrize(
    "text, finish_reason, says, never",
    [
        # the issue-17 case: JSON, then the model talks on; it stopped by itself, so nothing was cut off
        ('{"name": "Acme"} and "more', "stop", "went on after the JSON", ("max_new_tokens", "cut off")),
        ('{"name": "Acme", "employ', "stop", "did not enforce the output format", ("max_new_tokens", "cut off")),
        ("Sure! Here it is", "stop", "did not enforce the output format", ("max_new_tokens", "cut off")),
        ('{"name": "Acme", "employ', "length", "raise max_new_tokens", ("did not enforce",)),
        ('{"name": "Acme", "employ', None, "looks cut off", ("did not enforce",)),  # provider did not say
    ],
)
def test_json_hint_follows_the_finish_reason(text, finish_reason, says, never):
    _, error = validate_output(text, StructuredOutput(pydantic_model=COMPANY), finish_reason)
    assert says in error and not any(n in error for n in never), error


def test_wrong_type_error_names_the_path():
    body = {"name": "A", "employees": "x", "revenue_musd": 1, "public": True, "industry": "Retail", "tags": [],
            "hq": {"city": "c"}}
    _, error = validate_output(json.dumps(body), StructuredOutput(pydantic_model=COMPANY))
    assert "$.employees" in error and "integer" in error


def test_no_text_is_an_error_not_a_crash():
    assert validate_output(None, StructuredOutput(choices=["a"]))[1] == "no output text to validate"


def test_fallback_validator_without_jsonschema(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema -> ImportError
    s = StructuredOutput(pydantic_model=COMPANY)
    good = {"name": "A", "employees": 3, "revenue_musd": 1.5, "public": True, "industry": "Other", "tags": ["x"],
            "hq": {"city": "c", "postcode": None}, "parent": None}
    assert validate_output(json.dumps(good), s) == (good, None)
    for change, message in [
        ({"employees": "3"}, "$.employees"),
        ({"industry": "Mining"}, "is not one of"),
        ({"hq": {"postcode": "1"}}, "'city' is a required property"),
        ({"tags": [1]}, "$.tags[0]"),
        ({"parent": 5}, "anyOf"),
    ]:
        _, error = validate_output(json.dumps({**good, **change}), s)
        assert error is not None and message in error, (change, error)


# -- columns -----------------------------------------------------------------------------------------------------------
def test_struct_column_or_unnested_columns_with_failed_rows_null():
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "pop": {"type": "integer"}}}
    rows = [{"city": "Oslo", "pop": 700000}, None]
    names, arrays = build_columns(rows, StructuredOutput(json_schema=schema), "parsed")
    assert names == ["parsed"] and arrays[0].to_pylist() == rows

    names, arrays = build_columns(rows, StructuredOutput(json_schema=schema, unnest=True), "parsed")
    assert names == ["city", "pop"]
    assert [a.to_pylist() for a in arrays] == [["Oslo", None], [700000, None]]
    assert arrays[1].type == pa.int64()


def test_generation_params_with_two_constraints_are_refused():
    with pytest.raises(ValidationError, match="exactly one of"):
        StructuredOutput.from_params(GenerationParams(choices=("a",), regex="a"))
