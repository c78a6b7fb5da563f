"""Tests for the exercises of the *Data as tokens* lab (transformer_course.exercises.tokens).

Every solution passes its own checker, every listed mistake is diagnosed with its explanation, and
the solutions (written in plain torch for the learner) agree with the package's functions.
"""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import check, list_exercises
from transformer_course.exercises import tokens as ex_tokens

NAMES = list_exercises("tokens.")


def test_the_lab_has_five_exercises():
    assert NAMES == [
        "tokens.bpe_merge",
        "tokens.char_encode",
        "tokens.count_tokens",
        "tokens.one_hot_embed",
        "tokens.patchify",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_its_checker(name):
    fb = check(name, tc.exercises._get(name).solution)
    assert fb, fb.message
    assert fb.status == "correct"


MISTAKES = [
    (name, explanation) for name in NAMES for explanation in tc.exercises._get(name).mistakes
]


@pytest.mark.parametrize(
    ("name", "explanation"), MISTAKES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MISTAKES)]
)
def test_each_mistake_is_diagnosed(name, explanation):
    wrong = tc.exercises._get(name).mistakes[explanation]
    fb = check(name, wrong)
    assert fb.status == "incorrect"
    assert explanation in fb.message


@pytest.mark.parametrize("name", NAMES)
def test_stub_reports_not_attempted(name):
    def stub(*args):
        raise NotImplementedError

    assert check(name, stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------
# The solutions agree with the package
# ------------------------------------------------------------------------------------------------


def test_char_encode_matches_char_tokenizer():
    for text in ex_tokens._LINES:
        expected = tc.tokens.CharTokenizer.from_text(text).encode_tensor(text)
        assert torch.equal(ex_tokens.char_encode(text), expected)


def test_one_hot_embed_matches_embedding(gen):
    ids = torch.randint(0, 9, (2, 6), generator=gen)
    E = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(ex_tokens.one_hot_embed(ids, E), tc.tokens.embedding(ids, E))


def test_bpe_merge_matches_package_and_wikipedia_example():
    ids = torch.tensor(list(b"aaabdaaabac"))
    got = ex_tokens.bpe_merge(ids, (97, 97), 256)
    assert (
        got.tolist()
        == tc.tokens.merge_pair(ids, (97, 97), 256)
        == [256, 97, 98, 100, 256, 97, 98, 97, 99]
    )
    tok = tc.tokens.BPETokenizer.train("aaabdaaabac", vocab_size=257)
    assert tok.merges == [(97, 97)] and tok.encode("aaabdaaabac") == got.tolist()


def test_patchify_solution_matches_package(gen):
    images = torch.randn(2, 3, 8, 12, generator=gen)
    assert torch.equal(ex_tokens.patchify(images, 4), tc.tokens.patchify(images, 4))


@pytest.mark.parametrize(("H", "W", "P", "C"), [(224, 224, 16, 3), (30, 45, 7, 3), (8, 8, 4, 1)])
def test_count_tokens_matches_the_shape_of_cropped_patches(H, W, P, C):
    N, d = ex_tokens.count_tokens(H, W, P, C).tolist()
    cropped = torch.zeros(1, C, (H // P) * P, (W // P) * P)  # leftover edge pixels cropped
    assert tc.tokens.patchify(cropped, P).shape == (1, N, d)


# ------------------------------------------------------------------------------------------------
# What the framework says about mistakes that are not listed
# ------------------------------------------------------------------------------------------------


def test_transposed_embeddings_are_reported_as_a_transpose():
    def transposed(ids, E):
        return ex_tokens.one_hot_embed(ids, E).transpose(1, 2)  # (B, D, N)

    fb = check("tokens.one_hot_embed", transposed)
    assert fb.status == "incorrect" and "off by a transpose" in fb.message


def test_an_unlisted_wrong_length_is_reported_with_both_shapes():
    def unchanged(ids, pair, new_id):
        return ids  # no merge at all

    fb = check("tokens.bpe_merge", unchanged)
    assert fb.status == "incorrect" and "wrong shape: expected (9,), got (11,)" in fb.message


def test_length_changing_mistakes_are_named_not_just_measured():
    ids = torch.tensor(list(b"aaabdaaabac"))
    for name in ("first occurrence", "move past both ids"):
        explanation = next(e for e in tc.exercises._get("tokens.bpe_merge").mistakes if name in e)
        wrong = tc.exercises._get("tokens.bpe_merge").mistakes[explanation]
        assert len(wrong(ids, (97, 97), 258)) != len(ex_tokens.bpe_merge(ids, (97, 97), 258))
        assert explanation in check("tokens.bpe_merge", wrong).message


def test_returning_a_list_of_ids_is_accepted():
    def as_list(text):
        return ex_tokens.char_encode(text).tolist()

    assert check("tokens.char_encode", as_list)
