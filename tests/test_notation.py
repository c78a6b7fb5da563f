"""Turner's column form equals the course's row form, number for number."""

from __future__ import annotations

import pytest
import torch

from transformer_course.notation import (
    columns_to_rows,
    rows_to_columns,
    turner_attention,
    turner_self_attention,
)
from transformer_course.self_attention import attention_weights, single_head


@pytest.mark.parametrize(("N", "D", "K", "D_v"), [(1, 3, 2, 3), (6, 8, 4, 8), (9, 5, 5, 2)])
def test_column_form_equals_row_form(N, D, K, D_v, gen):
    X = torch.randn(N, D, generator=gen, dtype=torch.float64)
    W_q, W_k = (torch.randn(D, K, generator=gen, dtype=torch.float64) for _ in range(2))
    W_v = torch.randn(D, D_v, generator=gen, dtype=torch.float64)
    X_cols, U_q, U_k, U_v = rows_to_columns(X), W_q.T, W_k.T, W_v.T
    A_cols = turner_attention(X_cols, U_q, U_k)
    torch.testing.assert_close(A_cols.sum(0), torch.ones(N, dtype=torch.float64))  # columns
    torch.testing.assert_close(A_cols, attention_weights(X @ W_q, X @ W_k).T, atol=1e-12, rtol=0)
    Y_cols = turner_self_attention(X_cols, U_q, U_k, U_v)
    torch.testing.assert_close(
        columns_to_rows(Y_cols), single_head(X, W_q, W_k, W_v), atol=1e-12, rtol=0
    )


def test_turner_form_by_its_sum(gen):
    # y_n = sum_{n'} U_v x_{n'} A_{n',n}, evaluated term by term.
    X_cols = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    U_q, U_k, U_v = (torch.randn(3, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    A = turner_attention(X_cols, U_q, U_k, scale=1.0)
    Y = turner_self_attention(X_cols, U_q, U_k, U_v, scale=1.0)
    for n in range(5):
        y_n = sum(U_v @ X_cols[:, m] * A[m, n] for m in range(5))
        torch.testing.assert_close(Y[:, n], y_n)


def test_transposed_U_is_diagnosed():
    with pytest.raises(ValueError, match="looks transposed"):
        turner_attention(torch.randn(4, 5), torch.randn(4, 3), torch.randn(3, 4))


def test_round_trip():
    X = torch.randn(2, 3, 4)
    assert torch.equal(columns_to_rows(rows_to_columns(X)), X)
    assert rows_to_columns(X).shape == (2, 4, 3)


@pytest.mark.parametrize(("D", "H", "N"), [(4, 1, 3), (8, 2, 5), (12, 4, 6)])
def test_turner_multi_head_equals_concat_form(D, H, N, gen):
    """sum_h V_h X A_h == concat(heads) W_o, with V_h = (W_v^(h) W_o^(h))^T of rank <= D/H."""
    from transformer_course.multihead import multi_head_attention_reference
    from transformer_course.notation import low_rank_V, turner_multi_head_self_attention

    X = torch.randn(N, D, generator=gen, dtype=torch.float64)
    W_q, W_k, W_v, W_o = (torch.randn(D, D, generator=gen, dtype=torch.float64) for _ in range(4))
    K = D // H
    U_q = torch.stack([W_q[:, h * K : (h + 1) * K].T for h in range(H)])  # (H, K, D)
    U_k = torch.stack([W_k[:, h * K : (h + 1) * K].T for h in range(H)])
    V = low_rank_V(W_v, W_o, H)
    assert all(torch.linalg.matrix_rank(V[h]) <= K for h in range(H))
    Y_cols = turner_multi_head_self_attention(X.T, U_q, U_k, V)
    Y = multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
    torch.testing.assert_close(Y_cols.T, Y, atol=1e-10, rtol=0)


def test_column_form_takes_one_sequence_and_says_so():
    # book/notation.md: Turner's functions take one D x N sequence; the row-form functions take
    # (..., N, D) and give each sequence the same answer as on its own.
    X_cols = torch.randn(2, 4, 5, dtype=torch.float64)  # a batch (B, D, N): not accepted
    U = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="D x N"):
        turner_attention(X_cols, U, U)
    with pytest.raises(ValueError, match="D x N"):
        turner_self_attention(X_cols, U, U, U)
    X = torch.randn(2, 3, 5, 4, dtype=torch.float64)  # (..., N, D) with two leading dimensions
    W = torch.randn(4, 3, dtype=torch.float64)
    Y = single_head(X, W, W, W)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(
                Y[i, j],
                columns_to_rows(turner_self_attention(rows_to_columns(X[i, j]), W.T, W.T, W.T)),
                atol=1e-12,
                rtol=0,
            )
