"""Exercises of the *Attention as a weighted average* lab (Lab 2).

A weighted average for one token, turning raw scores into valid attention weights, the attention
matrix of a convolution, and the matrix form ``Y = A X`` in the course's row orientation.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import Mistake, exercise, randn


def _weights(gen: torch.Generator, *shape: int) -> Tensor:
    """Random valid attention weights: non-negative rows summing to one."""
    return torch.softmax(2 * randn(gen, *shape), dim=-1)


def _one_token_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    N, D = ((5, 3), (8, 4), (3, 6))[trial % 3]
    return randn(gen, N, D), _weights(gen, N)


@exercise(
    name="attention.one_token",
    prompt=(
        "The output for one token: X is (N, D), one token per row, and a is (N,) holding that "
        "token's attention weights a_m (non-negative, summing to one). Return "
        "y = sum_m a_m x_m, shape (D,)."
    ),
    make_inputs=_one_token_inputs,
    mistakes=[
        Mistake(
            "you returned the plain mean of the tokens: the weights a_m were ignored. "
            "Multiply token m by a_m before adding.",
            lambda X, a: X.mean(dim=0),
        ),
        Mistake(
            "you added the weighted tokens and then divided by N; the weights already sum to one, so "
            "y = sum_m a_m x_m needs no further division.",
            lambda X, a: (a @ X) / X.shape[0],
        ),
        Mistake(
            "you returned the unweighted sum of the tokens; each token must be multiplied by its "
            "weight a_m.",
            lambda X, a: X.sum(dim=0),
        ),
    ],
)
def one_token(X: Tensor, a: Tensor) -> Tensor:
    N, D = X.shape
    y = torch.zeros(D, dtype=X.dtype)
    for m in range(N):
        y = y + a[m] * X[m]  # weight token m by a_m
    return y  # (D,), the same as a @ X


def _score_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    N, M, spread = ((4, 6, 1.0), (7, 5, 3.0), (5, 5, 400.0))[trial % 3]
    return (spread * randn(gen, N, M),)  # the last trial has scores in the hundreds


@exercise(
    name="attention.normalise_scores",
    prompt=(
        "Turn raw scores S (N, M), any real numbers, into valid attention weights A (N, M): "
        "A[n, m] = exp(S[n, m]) / sum_m' exp(S[n, m']), so every entry is non-negative and every "
        "row sums to one. Scores can be large (hundreds), so the result must not overflow."
    ),
    make_inputs=_score_inputs,
    mistakes=[
        Mistake(
            "you normalised each column (over the queries, dim=0); each row n must sum to one over the "
            "keys m (dim=-1).",
            lambda S: torch.softmax(S, dim=0),
        ),
        Mistake(
            "you divided the scores by their row sums without exponentiating them first: the rows "
            "sum to one, but negative scores stay negative weights (and a row sum near zero blows "
            "them up). Apply exp() before normalising.",
            lambda S: S / S.sum(dim=-1, keepdim=True),
        ),
        Mistake(
            "you divided by the sum over the whole matrix; each row n is normalised on its own (sum "
            "over m only, keepdim=True).",
            lambda S: torch.exp(S) / torch.exp(S).sum(),
        ),
        Mistake(
            "you exponentiated the scores but did not divide by the row sums, so rows do not sum "
            "to one.",
            lambda S: torch.exp(S),
        ),
    ],
    rows_sum_to_one=True,
)
def normalise_scores(S: Tensor) -> Tensor:
    S = S - S.max(dim=-1, keepdim=True).values  # (N, M); the shift cancels, exp() cannot overflow
    E = torch.exp(S)  # non-negative
    return E / E.sum(
        dim=-1, keepdim=True
    )  # each row sums to one (this is torch.softmax(S, dim=-1))


def _kernel_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    J, N = ((3, 6), (5, 8), (4, 7))[trial % 3]  # an odd, a longer odd, and an even kernel
    return randn(gen, J), N


def _toeplitz(kernel: Tensor, N: int, shift: int, flip: bool = False) -> Tensor:
    J = kernel.numel()
    taps = kernel.flip(0) if flip else kernel
    A = torch.zeros(N, N, dtype=kernel.dtype)
    for n in range(N):
        for m in range(N):
            j = m - n + shift
            if 0 <= j < J:
                A[n, m] = taps[j]
    return A


def _circular(kernel: Tensor, N: int) -> Tensor:
    J, j0 = kernel.numel(), (kernel.numel() - 1) // 2
    A = torch.zeros(N, N, dtype=kernel.dtype)
    for n in range(N):
        for j in range(J):
            A[n, (n + j - j0) % N] += kernel[j]
    return A


@exercise(
    name="attention.convolution_matrix",
    prompt=(
        "Build the (N, N) attention matrix of a 1-D convolution (as F.conv1d computes it, padding="
        "'same', zeros beyond the ends): A[n, m] = kernel[m - n + j0] with j0 = (J - 1) // 2, and 0 "
        "where m - n + j0 is not in 0..J-1. Then A @ x is the convolution of x with the kernel."
    ),
    make_inputs=_kernel_inputs,
    mistakes=[
        Mistake(
            "your kernel is flipped, A[n, m] = kernel[J - 1 - (m - n + j0)] (for an odd J the same "
            "as kernel[n - m + j0]): that is a convolution in the signal-processing sense. F.conv1d "
            "(and Turner's A_{n',n} = A_{n'-n}) does not flip: use kernel[m - n + j0].",
            lambda k, N: _toeplitz(k, N, (k.numel() - 1) // 2, flip=True),
        ),
        Mistake(
            "the kernel is not centred: you used kernel[m - n], so output n only reads inputs "
            "n..n+J-1. Shift by j0 = (J - 1) // 2: kernel[m - n + j0].",
            lambda k, N: _toeplitz(k, N, 0),
        ),
        Mistake(
            "the kernel is centred on the wrong tap: for an even J, PyTorch's 'same' padding puts the "
            "extra tap on the right, j0 = (J - 1) // 2, not J // 2.",
            lambda k, N: _toeplitz(k, N, k.numel() // 2),
        ),
        Mistake(
            "your matrix wraps around (circular padding); beyond the ends the sequence reads zeros, "
            "so taps that fall off the sequence are dropped.",
            _circular,
        ),
    ],
)
def convolution_matrix(kernel: Tensor, N: int) -> Tensor:
    J = kernel.numel()
    j0 = (J - 1) // 2  # the centre tap (the left middle one when J is even)
    A = torch.zeros(N, N, dtype=kernel.dtype)
    for n in range(N):
        for m in range(N):
            j = m - n + j0  # which tap links output n to input m
            if 0 <= j < J:
                A[n, m] = kernel[j]
    return A  # every row is the kernel shifted by one place: a Toeplitz matrix


def _matrix_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    shapes = ((), (2,), (3,))[trial % 3]  # unbatched first, then batches of sequences
    N, D = ((5, 3), (6, 4), (4, 7))[trial % 3]
    return randn(gen, *shapes, N, D), _weights(gen, *shapes, N, N)


@exercise(
    name="attention.matrix_form",
    prompt=(
        "All outputs at once: X is (..., N, D) with tokens as rows, A is (..., N, N) with row n "
        "holding the weights of output n (rows sum to one). Return Y (..., N, D) with "
        "y_n = sum_m A[n, m] x_m, for any number of leading batch dimensions."
    ),
    make_inputs=_matrix_inputs,
    mistakes=[
        Mistake(
            "you used the transpose of A (A^T X, or X^T A transposed back): that weights output n by "
            "column n of A. In the row form row n of A holds output n's weights: Y = A @ X.",
            lambda X, A: A.transpose(-2, -1) @ X,
        ),
        Mistake(
            "you returned X unchanged: the weights in A were never applied. Row n of the output is "
            "sum_m A[n, m] x_m, the matrix product A @ X.",
            lambda X, A: X.clone(),
        ),
    ],
)
def matrix_form(X: Tensor, A: Tensor) -> Tensor:
    return A @ X  # (..., N, N) @ (..., N, D) -> (..., N, D); row n is sum_m A[n, m] x_m
