"""Sinusoidal encodings, the relative-shift property, learned positions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_course as tc
from transformer_course.exercises import position as ex_pos
from transformer_course.position import (
    LearnedPositionalEmbedding,
    relative_shift_matrix,
    sinusoidal_encoding,
)

# ----------------------------------------------------------------------------------------------
# The module


def test_sinusoid_by_hand():
    R = sinusoidal_encoding(4, 6, base=100.0, dtype=torch.float64)
    for n in range(4):
        for i in range(6):
            k = i // 2
            angle = n / 100.0 ** (2 * k / 6)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert abs(R[n, i].item() - expected) < 1e-12
    assert torch.equal(R[0, 1::2], torch.ones(3, dtype=torch.float64))  # cos(0) = 1


def test_bishop_index_form_agrees():
    """Bishop eq. 25: sin(n / L^(i/D)) for even i, cos(n / L^((i-1)/D)) for odd i."""
    D, L = 10, 30.0
    R = sinusoidal_encoding(20, D, L, dtype=torch.float64)
    for i in range(D):
        e = i if i % 2 == 0 else i - 1
        f = torch.sin if i % 2 == 0 else torch.cos
        torch.testing.assert_close(
            R[:, i], f(torch.arange(20.0, dtype=torch.float64) / L ** (e / D))
        )


def test_odd_width():
    R = sinusoidal_encoding(5, 7)
    assert R.shape == (5, 7)
    torch.testing.assert_close(R[:, 6], torch.sin(torch.arange(5.0) * 10_000.0 ** (-6 / 7)))


@settings(max_examples=25, deadline=None)
@given(k=st.integers(-20, 20), half=st.integers(1, 8), L=st.sampled_from([30.0, 100.0, 10_000.0]))
def test_shift_property(k, half, L):
    D = 2 * half
    R = sinusoidal_encoding(60, D, L, dtype=torch.float64)
    M = relative_shift_matrix(k, D, L)
    lo, hi = max(0, -k), min(60, 60 - k)
    torch.testing.assert_close(R[lo + k : hi + k], R[lo:hi] @ M.T, atol=1e-9, rtol=0)


def test_shift_matrix_is_a_rotation():
    M = relative_shift_matrix(5, 8)
    torch.testing.assert_close(M @ M.T, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(relative_shift_matrix(2, 8) @ relative_shift_matrix(3, 8), M)


def test_learned_embedding_adds_rows_and_refuses_long_sequences():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(5, 4)
    X = torch.zeros(2, 3, 4)
    torch.testing.assert_close(pe(X)[1], pe.table.weight[:3])
    with pytest.raises(ValueError, match=r"positions 0\.\.5 go beyond the 5 learned positions"):
        pe(torch.zeros(1, 6, 4))
    torch.testing.assert_close(pe(X, start=2)[0], pe.table.weight[2:5])  # a cached prefix of 2
    with pytest.raises(ValueError, match="start must be >= 0"):  # not nn.Embedding's IndexError
        pe(X, start=-1)


def test_rows_that_training_never_reaches_only_shrink_by_the_weight_decay():
    """The chapter's claim about unseen rows: zero gradient, so AdamW (``make_optimizer`` decays every
    matrix, embedding tables included) multiplies them by ``1 - lr_s * weight_decay`` at every step."""
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(12, 4)
    before = pe.table.weight.detach().clone()
    cfg = tc.train.TrainConfig(max_steps=30, lr=0.05, warmup_steps=5, weight_decay=0.2)
    tc.train.train(
        pe, lambda g: (torch.randn(2, 7, 4, generator=g),), lambda m, b: m(b[0]).pow(2).mean(),
        cfg, progress=False,
    )  # fmt: skip
    factor = math.prod(1 - tc.train.lr_at(s, cfg) * cfg.weight_decay for s in range(30))
    after = pe.table.weight.detach()
    torch.testing.assert_close(after[7:], before[7:] * factor, rtol=1e-5, atol=1e-9)
    assert factor < 0.9 and not torch.allclose(after[:7], before[:7] * factor)


def test_bad_input():
    with pytest.raises(ValueError, match="even D"):
        relative_shift_matrix(1, 5)
    with pytest.raises(ValueError, match="base must be > 1"):
        sinusoidal_encoding(3, 4, base=1.0)


# ----------------------------------------------------------------------------------------------
# Exercises

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
