"""Sinusoidal encodings, the relative-shift property, learned positions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_course.position import (
    LearnedPositionalEmbedding,
    relative_shift_matrix,
    sinusoidal_encoding,
)


def test_sinusoid_by_hand():
    R = sinusoidal_encoding(4, 6, L=100.0, dtype=torch.float64)
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


def test_bad_input():
    with pytest.raises(ValueError, match="even D"):
        relative_shift_matrix(1, 5)
    with pytest.raises(ValueError, match="L must be > 1"):
        sinusoidal_encoding(3, 4, L=1.0)
