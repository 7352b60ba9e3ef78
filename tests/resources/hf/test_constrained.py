"""The grammars of constrained decoding (resources/hf/constrained.py), compiled by the real xgrammar against a
character-level vocabulary, so what each grammar accepts is checked string by string without loading a model (the
model-level path: tests/resources/hf/test_transformers_constrained.py).

What a user depends on: `choices` accepts exactly the labels (labels with quotes, backslashes, non-ASCII letters
and newlines included: any escaping slip would let the model write a label that is not one, or refuse a real one);
JSON is compact (a small model cannot pad with newlines until its budget runs out); a constraint xgrammar cannot
take fails the call naming the constraint kind."""

from __future__ import annotations

import string

import pytest
import xgrammar as xgr

from batch_assets.resources.hf.constrained import choices_grammar, compile_constraint
from batch_assets.resources.protocols import GenerationParams

EOS = "<eos>"
ALPHABET = sorted(set(string.printable) | set("éüß—日本"))
VOCAB = [*ALPHABET, EOS]


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    info = xgr.TokenizerInfo(VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[VOCAB.index(EOS)])
    return xgr.GrammarCompiler(info, max_threads=1)


def accepts(compiled: xgr.CompiledGrammar, text: str) -> bool:
    """Whether the grammar lets a model write exactly `text` and then stop."""
    matcher = xgr.GrammarMatcher(compiled)
    for char in text:
        if char not in ALPHABET or not matcher.accept_token(VOCAB.index(char)):
            return False
    return matcher.accept_token(VOCAB.index(EOS))


LABELS = ("positive", "negative", 'say "yes"', r"back\slash", "café", "multi\nline", "日本", "a — b")


def test_choices_accept_exactly_the_labels_however_they_are_spelled(compiler):
    compiled = compile_constraint(compiler, GenerationParams(choices=LABELS))
    for label in LABELS:
        assert accepts(compiled, label), label
    for other in ("posit", "positive ", "Positive", "say yes", "back\\\\slash", "cafe", "", "negativepositive"):
        assert not accepts(compiled, other), other


def test_the_choices_grammar_is_one_alternative_per_label():
    assert choices_grammar(["a", 'b"c']) == 'root ::= "a" | "b\\"c"'


def test_json_output_is_compact_so_a_model_cannot_pad_it(compiler):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["name", "n"], "additionalProperties": False}
    compiled = compile_constraint(compiler, GenerationParams(json_schema=schema))
    assert accepts(compiled, '{"name": "x", "n": 3}')
    assert not accepts(compiled, '{\n  "name": "x",\n  "n": 3\n}')
    assert not accepts(compiled, '{"name": "x"}')  # a required field missing
    assert not accepts(compiled, '{"name": "x", "n": "3"}')  # the wrong type


def test_a_regex_is_enforced_whole(compiler):
    compiled = compile_constraint(compiler, GenerationParams(regex=r"[A-Z]{2}-\d{3}"))
    assert accepts(compiled, "AB-123")
    assert not accepts(compiled, "AB-1234") and not accepts(compiled, "ab-123")


@pytest.mark.parametrize(("params", "kind"), [
    (GenerationParams(regex=r"(?<=a)b"), "regex"),  # lookbehind: not a regular language xgrammar takes
    (GenerationParams(json_schema={"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}), "json_schema"),
])
def test_a_constraint_xgrammar_cannot_take_fails_the_call_naming_its_kind(compiler, params, kind):
    with pytest.raises(ValueError, match=f"the {kind} constraint cannot be compiled for constrained decoding"):
        compile_constraint(compiler, params)
