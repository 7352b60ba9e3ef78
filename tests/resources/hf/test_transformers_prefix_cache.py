"""The shared-prefix key/value cache of the transformers generator changes speed, never answers."""

from __future__ import annotations

import pytest

from batch_assets.resources.hf.generator import TransformersGenerator
from batch_assets.resources.protocols import GenerationParams

pytestmark = pytest.mark.slow

SYSTEM = ("You are a helpful assistant that infers company industries. Output only the industry category. "
          "Choose from: Law Firm, Healthcare, Technology, Manufacturing, Other.")
NAMES = ["Acme Law Group", "Harbor Medical Center", "Nova Software Inc", "Apex Manufacturing Co",
         "Quinn & Baker LLP", "Summit Industrial Works", "Cedar Health Partners", "Orbit Technologies"]
LABELS = ("Law Firm", "Healthcare", "Technology", "Manufacturing", "Other")


@pytest.fixture(scope="module")
def generators() -> tuple[TransformersGenerator, TransformersGenerator]:
    cached = TransformersGenerator(batch_size=4, prefix_cache=True).load_for_tests()
    plain = TransformersGenerator(batch_size=4, prefix_cache=False)
    plain._model = cached._model  # same weights, no second load
    return cached, plain


def _conversations() -> list[list[dict]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Industry of {n}?"}] for n in NAMES]


def test_shared_prefix_is_found_and_answers_are_identical(generators) -> None:
    cached, plain = generators
    ids = cached.encode_prompts(_conversations())
    prefix = cached.shared_prefix(ids)
    assert prefix is not None and len(prefix[0]) >= 30  # the chat template and the whole system message
    params = GenerationParams(max_new_tokens=8)
    a = cached.generate(_conversations(), params)
    b = plain.generate(_conversations(), params)
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.prompt_tokens for g in a] == [g.prompt_tokens for g in b]


def test_constrained_choices_identical_and_never_cut_off(generators) -> None:
    cached, plain = generators
    # max_new_tokens smaller than the token count of 'Manufacturing' spelled by the grammar: still a whole label
    params = GenerationParams(max_new_tokens=2, choices=LABELS)
    a = cached.generate(_conversations(), params)
    b = plain.generate(_conversations(), params)
    assert [g.text for g in a] == [g.text for g in b]
    assert all(g.error is None and g.text in LABELS for g in a)


def test_stop_strings_end_generation_early_and_are_cut(generators) -> None:
    cached, _ = generators
    free = cached.generate(_conversations(), GenerationParams(max_new_tokens=12))
    stopped = cached.generate(_conversations(), GenerationParams(max_new_tokens=12, stop=(" ",)))
    # the same greedy answer, cut before the first stop string: stopping early changes no earlier token
    assert [g.text for g in stopped] == [g.text.split(" ")[0] for g in free]
    assert all(s.completion_tokens <= f.completion_tokens for s, f in zip(stopped, free))
    assert sum(s.completion_tokens for s in stopped) < sum(f.completion_tokens for f in free)
