"""Exercises of the *Position* lab: each solution passes its checker, each listed mistake is diagnosed
with its own explanation, and the solutions agree with the package's position module."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import position as ex_pos

NAMES = [
    "position.sinusoidal",
    "position.rotation_block",
    "position.concat_weight",
    "position.equivariance_gap",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("position.") == sorted(NAMES)


def test_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError

    for name in NAMES:
        assert tc.exercises.check(name, stub).status == "not attempted"


@pytest.mark.parametrize(("N", "D", "L"), [(5, 2, 10.0), (20, 16, 30.0), (9, 64, 10_000.0)])
def test_sinusoidal_solution_is_the_package_encoding(N, D, L):
    expected = tc.position.sinusoidal_encoding(N, D, L, dtype=torch.float64)
    torch.testing.assert_close(ex_pos.sinusoidal(N, D, L), expected, atol=1e-12, rtol=0)


def test_rotation_blocks_assemble_the_package_shift_matrix():
    D, L, k = 8, 30.0, 5
    omega = L ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    M = torch.block_diag(*[ex_pos.rotation_block(w, k) for w in omega])  # (D, D)
    torch.testing.assert_close(M, tc.position.relative_shift_matrix(k, D, L), atol=1e-12, rtol=0)
    R = tc.position.sinusoidal_encoding(40, D, L, dtype=torch.float64)
    torch.testing.assert_close(R[k:], R[:-k] @ M.T, atol=1e-12, rtol=0)


def test_concat_weight_turns_concatenation_into_a_sum():
    g = torch.Generator().manual_seed(0)
    X, R = torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)
    W_1, W_2 = torch.randn(5, 4, generator=g), torch.randn(3, 4, generator=g)
    W = ex_pos.concat_weight(W_1, W_2)
    torch.testing.assert_close(torch.cat([X, R], dim=1) @ W, X @ W_1 + R @ W_2)
    # adding the positions directly is the special case W_1 = W_2 = I
    eye = torch.eye(5)
    R5 = torch.randn(6, 5, generator=g)
    torch.testing.assert_close(torch.cat([X, R5], dim=1) @ ex_pos.concat_weight(eye, eye), X + R5)


def test_equivariance_gap_separates_equivariant_from_ordered_maps():
    torch.manual_seed(0)
    X = torch.randn(2, 6, 8, dtype=torch.float64)
    perm = torch.tensor([2, 0, 1, 5, 3, 4])
    for block in (tc.block.PreNormBlock(8, 2), tc.block.PostNormBlock(8, 2)):
        assert ex_pos.equivariance_gap(block.double().eval(), X, perm) < 1e-12
    positions = tc.position.LearnedPositionalEmbedding(6, 8).double()
    assert ex_pos.equivariance_gap(positions, X, perm) > 1e-3


def test_building_the_checker_inputs_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tc.exercises.check("position.equivariance_gap", ex_pos.equivariance_gap)
    torch.testing.assert_close(torch.rand(3), expected)


def test_equivariance_messages_name_the_function_briefly():
    fb = tc.exercises.check("position.equivariance_gap", lambda f, X, perm: f(X).sum())
    assert fb.status == "incorrect"
    assert "<f: a pre-norm block, D=8, H=2>" in fb.message and "Linear(" not in fb.message
