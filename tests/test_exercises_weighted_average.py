"""Lab 2's exercises: solutions pass, typical mistakes are diagnosed with their explanation."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
import transformer_course.relations as relations
from transformer_course.exercises import check, list_exercises

NAMES = [
    "attention.convolution_matrix",
    "attention.matrix_form",
    "attention.normalise_scores",
    "attention.one_token",
]


def test_the_lab_exercises_are_registered():
    assert list_exercises("attention.") == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_and_has_mistakes(name):
    ex = tc.exercises._get(name)
    assert check(name, ex.solution).status == "correct"
    assert len(ex.mistakes) >= 2


def test_inputs_vary_in_size():
    for name in NAMES:
        ex = tc.exercises._get(name)
        sizes = {
            tuple(
                tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in ex.make_inputs(g, t)
            )
            for t, g in enumerate(torch.Generator().manual_seed(s) for s in range(3))
        }
        assert len(sizes) == 3, name


def test_valid_weights_in_inputs():
    # the weights handed to one_token and matrix_form satisfy the two constraints
    gen = torch.Generator().manual_seed(0)
    for trial in range(3):
        _, a = tc.exercises._get("attention.one_token").make_inputs(gen, trial)
        _, A = tc.exercises._get("attention.matrix_form").make_inputs(gen, trial)
        assert relations.constraint_violations(a[None]) == []
        assert relations.constraint_violations(A) == []


def test_naive_exp_overflows_and_is_reported():
    # exp() of scores in the hundreds overflows to inf; the checker points at exp() overflow
    def naive(S):
        E = torch.exp(S)
        return E / E.sum(dim=-1, keepdim=True)

    feedback = check("attention.normalise_scores", naive)
    assert feedback.status == "incorrect" and "exp() overflow" in feedback.message
    assert check("attention.normalise_scores", lambda S: torch.softmax(S, dim=-1))


def test_orientation_mistakes_not_listed_are_still_explained():
    shape = check("attention.matrix_form", lambda X, A: X.mT @ A)
    assert "wrong shape: expected (5, 3), got (3, 5)" in shape.message
    transposed = check("attention.matrix_form", lambda X, A: (A @ X).mT)
    assert "off by a transpose" in transposed.message


def test_convolution_matrix_agrees_with_the_package():
    # the exercise's reference and relations.convolution_as_attention are the same matrix
    assert check(
        "attention.convolution_matrix", lambda k, N: relations.convolution_as_attention(k, N)
    )
    ex = tc.exercises._get("attention.convolution_matrix")
    gen = torch.Generator().manual_seed(0)
    for trial in range(3):
        kernel, N = ex.make_inputs(gen, trial)
        torch.testing.assert_close(
            ex.solution(kernel, N), relations.convolution_as_attention(kernel, N), atol=0, rtol=0
        )
