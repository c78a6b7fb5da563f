"""Exercises of the *Notation and conventions* lab: moving between Turner's column form and rows."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import Mistake, exercise


def _turner_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    D, N, d_k, d_v = (4, 5, 3, 4), (6, 3, 7, 5), (2, 3, 4, 2), (4, 2, 5, 3)
    D, N, d_k, d_v = D[trial % 4], N[trial % 4], d_k[trial % 4], d_v[trial % 4]

    def r(*s: int) -> Tensor:
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    return r(D, N), r(d_k, D), r(d_k, D), r(d_v, D)


def _row_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    X_cols, U_q, U_k, U_v = _turner_inputs(gen, trial)
    return X_cols.T.contiguous(), U_q.T.contiguous(), U_k.T.contiguous(), U_v.T.contiguous()


@exercise(
    name="notation.turner_to_row_weights",
    prompt=(
        "Given Turner's attention matrix A_cols (N x N, A_cols[n', n], columns sum to one), return the "
        "course's row-form A (N x N, A[n, m], rows sum to one)."
    ),
    make_inputs=lambda gen, trial: (
        torch.softmax(torch.randn(4 + trial, 4 + trial, generator=gen, dtype=torch.float64), dim=0),
    ),
    mistakes=[
        Mistake(
            "you returned Turner's matrix unchanged: its entry [n', n] belongs to query n, so the row "
            "form's A[n, m] is its transpose.",
            lambda A_cols: A_cols,
        ),
    ],
    rows_sum_to_one=True,
)
def turner_to_row_weights(A_cols: Tensor) -> Tensor:
    # Turner indexes [key n', query n] and normalises columns; the row form indexes [query, key].
    return A_cols.T


@exercise(
    name="notation.row_self_attention",
    prompt=(
        "Single-head self-attention in the row form: X is (N, D), W_q and W_k are (D, d_k), W_v is "
        "(D, d_v). Return Y = softmax(Q K^T / sqrt(d_k)) V of shape (N, d_v), softmax over each row."
    ),
    make_inputs=_row_inputs,
    mistakes=[
        Mistake(
            "the 1/sqrt(d_k) scale is missing: divide the scores Q K^T by sqrt(d_k) before the softmax.",
            lambda X, W_q, W_k, W_v: torch.softmax((X @ W_q) @ (X @ W_k).T, dim=-1) @ (X @ W_v),
        ),
        Mistake(
            "the softmax normalised the columns (dim=0); each query's row must sum to one (dim=-1).",
            lambda X, W_q, W_k, W_v: (
                torch.softmax((X @ W_q) @ (X @ W_k).T / math.sqrt(W_q.shape[1]), dim=0) @ (X @ W_v)
            ),
        ),
        Mistake(
            "queries and keys are swapped: the scores are Q K^T (row n is query n), not K Q^T.",
            lambda X, W_q, W_k, W_v: (
                torch.softmax((X @ W_k) @ (X @ W_q).T / math.sqrt(W_q.shape[1]), dim=-1) @ (X @ W_v)
            ),
        ),
    ],
)
def row_self_attention(X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor) -> Tensor:
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # (N, d_k), (N, d_k), (N, d_v)
    S = Q @ K.T / math.sqrt(Q.shape[-1])  # (N, N) scores, row n = query n
    A = torch.softmax(S, dim=-1)  # rows sum to one
    return A @ V  # (N, d_v)


@exercise(
    name="notation.turner_self_attention",
    prompt=(
        "Single-head self-attention in Turner's column form: X_cols is (D, N), U_q and U_k are "
        "(d_k, D) (Turner writes K x D), U_v is (d_v, D). Return Y_cols = U_v X_cols A_cols of shape "
        "(d_v, N), where A_cols[n', n] = softmax over n' of k_{n'}.q_n / sqrt(d_k) (columns sum to "
        "one)."
    ),
    make_inputs=_turner_inputs,
    mistakes=[
        Mistake(
            "the softmax normalised the rows of A_cols; in Turner's form each column sums to one (dim=0).",
            lambda X, U_q, U_k, U_v: (
                U_v @ X @ torch.softmax((U_k @ X).T @ (U_q @ X) / math.sqrt(U_q.shape[0]), dim=1)
            ),
        ),
        Mistake(
            "the 1/sqrt(d_k) scale is missing (Turner absorbs it into his maps; here it is explicit).",
            lambda X, U_q, U_k, U_v: U_v @ X @ torch.softmax((U_k @ X).T @ (U_q @ X), dim=0),
        ),
        Mistake(
            "A_cols is transposed: its entry [n', n] is k_{n'}.q_n, i.e. (U_k X)^T (U_q X).",
            lambda X, U_q, U_k, U_v: (
                U_v @ X @ torch.softmax((U_q @ X).T @ (U_k @ X) / math.sqrt(U_q.shape[0]), dim=0)
            ),
        ),
    ],
)
def turner_self_attention(X_cols: Tensor, U_q: Tensor, U_k: Tensor, U_v: Tensor) -> Tensor:
    Q_cols, K_cols = U_q @ X_cols, U_k @ X_cols  # (d_k, N) each: column n is q_n, k_n
    A_cols = torch.softmax(K_cols.T @ Q_cols / math.sqrt(U_q.shape[0]), dim=0)  # (N, N)
    return U_v @ X_cols @ A_cols  # (d_v, N)
