"""Convolution as attention: the Toeplitz matrix equals F.conv1d, by loop and by PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
import transformer_course.attention as attention
from transformer_course.attention import (
    constraint_violations,
    convolution_as_attention,
    convolve_tokens,
    moving_average_kernel,
)
from transformer_course.exercises import check, list_exercises

# ----------------------------------------------------------------------------------------------
# The module

pytestmark = pytest.mark.filterwarnings(
    # F.conv1d(padding="same") warns that an even kernel needs a padded copy of the input: harmless.
    "ignore:Using padding='same' with even kernel lengths:UserWarning"
)


def loop_matrix(kernel, N, padding):
    """A[n, m] by its definition: add k_j wherever tap j of output n reads input m."""
    K, c = len(kernel), (len(kernel) - 1) // 2
    A = torch.zeros(N, N, dtype=kernel.dtype)
    for n in range(N):
        for j in range(K):
            p = n + j - c
            if padding == "circular":
                p %= N
            elif padding == "replicate":
                p = min(max(p, 0), N - 1)
            elif not 0 <= p < N:
                continue
            A[n, p] += kernel[j]
    return A


def conv1d_columns(X, kernel, padding):
    """PyTorch's own layer on each column of X (N, D): channels = features, same kernel for each."""
    K = kernel.numel()
    x = X.T.unsqueeze(1)  # (D, 1, N): one sequence per feature column
    if padding == "zeros":
        y = F.conv1d(x, kernel.view(1, 1, K), padding="same")
    else:  # nn.Conv1d with padding_mode="circular"/"replicate" and padding="same"
        conv = torch.nn.Conv1d(1, 1, K, padding="same", padding_mode=padding, bias=False)
        conv = conv.to(X.dtype)
        with torch.no_grad():
            conv.weight.copy_(kernel.view(1, 1, K))
            y = conv(x)
    return y.squeeze(1).T  # (N, D)


SIZES = [(1, 5), (2, 6), (3, 7), (4, 7), (5, 5), (6, 9), (7, 4)]  # (K, N): odd and even kernels


@pytest.mark.parametrize(
    ("K", "N", "padding"),
    [(K, N, p) for K, N in SIZES for p in attention.PADDINGS if p != "circular" or K <= N],
)
def test_matrix_equals_conv1d_and_loop(K, N, padding, gen):
    kernel = torch.randn(K, generator=gen, dtype=torch.float64)
    X = torch.randn(N, 3, generator=gen, dtype=torch.float64)  # three channels as columns
    A = convolution_as_attention(kernel, N, padding)
    torch.testing.assert_close(A, loop_matrix(kernel, N, padding), atol=1e-12, rtol=0)
    if padding == "zeros" or K <= N:  # PyTorch's circular/replicate pad needs pad < N
        torch.testing.assert_close(A @ X, conv1d_columns(X, kernel, padding), atol=1e-12, rtol=0)
    torch.testing.assert_close(convolve_tokens(X, kernel, padding), A @ X, atol=1e-12, rtol=0)


def test_hand_computed_odd_and_even():
    A3 = convolution_as_attention(torch.tensor([1.0, 2.0, 3.0]), 4)
    expected3 = torch.tensor(
        [[2.0, 3.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.0], [0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 1.0, 2.0]]
    )
    assert torch.equal(A3, expected3)
    # even K = 2: centre c = 0, output n reads inputs n and n + 1 (PyTorch pads on the right)
    A2 = convolution_as_attention([1.0, 2.0], 3)
    assert torch.equal(A2, torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 2.0], [0.0, 0.0, 1.0]]))


def test_toeplitz_and_turner_index():
    # every diagonal is constant, and Turner's A_T[n', n] = A[n, n'] depends on n' - n only
    kernel = torch.arange(1.0, 6.0)
    N, c = 8, 2
    A = convolution_as_attention(kernel, N)
    A_turner = A.T
    for n_prime in range(N):
        for n in range(N):
            j = n_prime - n + c
            expected = kernel[j] if 0 <= j < 5 else 0.0
            assert A_turner[n_prime, n] == expected


def test_is_cross_correlation_not_flipped_convolution():
    # numpy.convolve flips the kernel; the attention matrix (like conv1d) does not.
    kernel = np.array([1.0, 2.0, 5.0])
    x = np.arange(7.0) ** 2
    y = (convolution_as_attention(torch.from_numpy(kernel), 7) @ torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, np.convolve(x, kernel[::-1], mode="same"))
    assert not np.allclose(y, np.convolve(x, kernel, mode="same"))


def test_batched_convolve_tokens(gen):
    X = torch.randn(2, 3, 6, 4, generator=gen, dtype=torch.float64)  # (B1, B2, N, D)
    kernel = torch.randn(3, generator=gen, dtype=torch.float64)
    A = convolution_as_attention(kernel, 6)
    torch.testing.assert_close(convolve_tokens(X, kernel), A @ X, atol=1e-12, rtol=0)


def test_moving_average_rows_and_paddings():
    N, w = 7, 3
    k = moving_average_kernel(w, dtype=torch.float64)
    assert torch.allclose(k.sum(), torch.tensor(1.0, dtype=torch.float64)) and (k > 0).all()
    zeros = convolution_as_attention(k, N, "zeros")
    # interior rows average w tokens; the two end rows lose one tap each
    torch.testing.assert_close(zeros.sum(1)[1:-1], torch.ones(N - 2, dtype=torch.float64))
    torch.testing.assert_close(zeros.sum(1)[[0, -1]], torch.full((2,), 2 / 3, dtype=torch.float64))
    assert (
        len(constraint_violations(zeros)) == 1 and "2 of 7 rows" in constraint_violations(zeros)[0]
    )
    for padding in ("circular", "replicate"):
        A = convolution_as_attention(k, N, padding)
        assert constraint_violations(A) == []  # valid attention weights


@pytest.mark.parametrize(
    "kernel",
    [[-1.0, 0.0, 1.0], [-0.5, 2.0, -0.5], [0.5, 0.5, 0.5], [0.2, 0.3]],
    ids=["difference", "sharpen (sums to one)", "sums to 1.5", "sums to 0.5"],
)
@pytest.mark.parametrize("padding", attention.PADDINGS)
def test_only_averaging_kernels_give_attention_weights(kernel, padding):
    """The module docstring: for a kernel no longer than the sequence (J <= N, here N = 6), a
    convolution's matrix is a valid matrix of attention weights only for a kernel with non-negative
    taps summing to one, whatever the padding."""
    A = convolution_as_attention(torch.tensor(kernel, dtype=torch.float64), 6, padding)
    assert constraint_violations(A)


def test_toeplitz_rows_sum_to_one_only_when_circulant(gen):
    # Row n minus row n-1 of a Toeplitz matrix is a_{-n} - a_{N-n}: all rows sum to one exactly when
    # the taps repeat with period N, i.e. the matrix is circulant.
    N = 5
    c = torch.softmax(torch.randn(N, generator=gen, dtype=torch.float64), 0)  # one period
    full = torch.cat([c[1:], c])  # 2N-1 taps a_{-(N-1)} .. a_{N-1} with a_j = c_{j mod N}
    A = convolution_as_attention(full, N)
    assert constraint_violations(A) == []
    assert full.sum() > 1.01  # J = 2N - 1 > N: valid although the taps do not sum to one
    torch.testing.assert_close(A, convolution_as_attention(c.roll((N - 1) // 2), N, "circular"))
    broken = full.clone()
    broken[0] += 0.1  # a_{-(N-1)} no longer equals a_1
    assert constraint_violations(convolution_as_attention(broken, N))


@pytest.mark.parametrize(("J", "N"), [(1, 4), (2, 5), (3, 3), (3, 7), (4, 6), (5, 5)])
def test_zero_padding_keeps_only_the_identity_valid(J, N, gen):
    """The module docstring: with zero padding and J <= N, the only kernel whose matrix is valid
    attention is the identity's, a single tap 1 at the centre; an averaging kernel is not enough."""
    j0 = (J - 1) // 2
    identity = torch.zeros(J, dtype=torch.float64)
    identity[j0] = 1.0
    assert torch.equal(convolution_as_attention(identity, N), torch.eye(N, dtype=torch.float64))
    for _ in range(50):  # averaging kernels with mass off the centre
        kernel = torch.softmax(3 * torch.randn(J, generator=gen, dtype=torch.float64), 0)
        if J > 1:
            assert constraint_violations(convolution_as_attention(kernel, N))
        for padding in ("circular", "replicate"):  # wrapping or repeating the ends restores them
            assert constraint_violations(convolution_as_attention(kernel, N, padding)) == []


def test_softmax_weights_underflow_to_zero_in_floating_point():
    """The chapter: a softmax weight is positive in exact arithmetic, but it is exactly 0 once its
    score trails the row's largest by more than about 104 in float32 (745 in float64)."""
    for dtype, below, beyond in [(torch.float32, 103.0, 104.5), (torch.float64, 744.0, 746.0)]:
        assert torch.softmax(torch.tensor([0.0, -below], dtype=dtype), 0)[1] > 0
        assert torch.softmax(torch.tensor([0.0, -beyond], dtype=dtype), 0)[1] == 0


def test_follows_kernel_dtype_device_and_gradient():
    kernel = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64, requires_grad=True)
    A = convolution_as_attention(kernel, 4)
    assert A.dtype == torch.float64 and A.device == kernel.device
    A.sum().backward()  # each tap is used once per row it reaches: 3, 4 and 3 times
    assert torch.equal(kernel.grad, torch.tensor([3.0, 4.0, 3.0], dtype=torch.float64))


def test_constraint_violations_messages():
    good = torch.softmax(torch.randn(3, 4), dim=-1)
    assert constraint_violations(good) == []
    neg = torch.tensor([[1.5, -0.5], [0.5, 0.5]])
    (msg,) = constraint_violations(neg)
    assert "1 of 2 rows have negative weights" in msg
    both = constraint_violations(torch.tensor([[-1.0, 0.0], [0.2, 0.2]]))
    assert len(both) == 2 and "do not sum to one" in both[1]
    assert constraint_violations(torch.tensor([[float("nan"), 1.0]])) == [
        "some weights are NaN or infinite"
    ]
    with pytest.raises(ValueError, match=r"\(\.\.\., N, M\)"):
        constraint_violations(torch.ones(3))


@pytest.mark.parametrize(
    ("kernel", "N", "padding", "error", "match"),
    [
        (torch.ones(0), 4, "zeros", ValueError, "at least one tap"),
        (torch.ones(1, 1, 3), 4, "zeros", ValueError, r"weight\[o, i\]"),
        (torch.ones(2, 3), 4, "zeros", ValueError, "must be 1-D"),
        (torch.ones(3, dtype=torch.int64), 4, "zeros", TypeError, r"kernel\.float\(\)"),
        (torch.ones(8), 4, "zeros", ValueError, "2N-1=7"),
        (torch.ones(5), 4, "circular", ValueError, "at most as long as the sequence"),
        (torch.ones(3), 0, "zeros", ValueError, "at least 1"),
        (torch.ones(3), 4.0, "zeros", TypeError, "must be an int"),
        (torch.ones(3), 4, "same", ValueError, "padding must be one of"),
        ("abc", 4, "zeros", TypeError, "sequence of numbers"),
    ],
)
def test_bad_input_is_explained(kernel, N, padding, error, match):
    with pytest.raises(error, match=match):
        convolution_as_attention(kernel, N, padding)


def test_largest_kernels_allowed():
    # 2N-1 taps with zeros reach every pair (n, m); N taps with circular padding fill the matrix
    A = convolution_as_attention(torch.arange(1.0, 8.0), 4)
    assert (A > 0).all() and A[0, 0] == 4.0 and A[0, 3] == 7.0 and A[3, 0] == 1.0
    assert (convolution_as_attention(torch.ones(4), 4, "circular") == 1).all()


def test_convolve_tokens_bad_input():
    with pytest.raises(ValueError, match=r"\(\.\.\., N, D\)"):
        convolve_tokens(torch.ones(5), torch.ones(3))
    with pytest.raises(TypeError, match="dtype"):
        convolve_tokens(torch.ones(5, 2, dtype=torch.float64), torch.ones(3))
    with pytest.raises(ValueError, match="positive int"):
        moving_average_kernel(0)


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "attention.convolution_matrix",
    "attention.matrix_form",
    "attention.normalise_scores",
    "attention.one_token",
]


def test_the_lab_exercises_are_registered():
    assert list_exercises("attention.") == NAMES


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
        assert attention.constraint_violations(a[None]) == []
        assert attention.constraint_violations(A) == []


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
    # the exercise's reference and attention.convolution_as_attention are the same matrix
    assert check(
        "attention.convolution_matrix", lambda k, N: attention.convolution_as_attention(k, N)
    )
    ex = tc.exercises._get("attention.convolution_matrix")
    gen = torch.Generator().manual_seed(0)
    for trial in range(3):
        kernel, N = ex.make_inputs(gen, trial)
        torch.testing.assert_close(
            ex.solution(kernel, N), attention.convolution_as_attention(kernel, N), atol=0, rtol=0
        )


@pytest.mark.parametrize("J", [3, 4, 5])
def test_flipped_kernel_feedback_names_the_matrix_it_diagnoses(J, gen):
    """The checker's message for a flipped kernel, A[n, m] = kernel[J - 1 - (m - n + j0)], is the
    matrix its mistake computes, for odd and even J (for an odd J it is kernel[n - m + j0])."""
    ex = tc.exercises._get("attention.convolution_matrix")
    flipped = next(m for m in ex.mistakes if "flipped" in m.why)
    assert "kernel[J - 1 - (m - n + j0)]" in flipped.why
    kernel, N, j0 = torch.randn(J, generator=gen, dtype=torch.float64), 7, (J - 1) // 2
    by_message = torch.zeros(N, N, dtype=torch.float64)
    for n in range(N):
        for m in range(N):
            if 0 <= m - n + j0 < J:
                by_message[n, m] = kernel[J - 1 - (m - n + j0)]
    assert torch.equal(flipped.wrong(kernel, N), by_message)
    mirrored = torch.tensor(
        [
            [float(kernel[n - m + j0]) if 0 <= n - m + j0 < J else 0.0 for m in range(N)]
            for n in range(N)
        ],
        dtype=torch.float64,
    )
    assert torch.equal(mirrored, by_message) == (J % 2 == 1)


def test_contraction_coefficient_by_loop_and_bound(gen):
    # book eq. eq-avg-contraction: tau(A) = 1 - min_{n,n'} sum_m min(a_nm, a_n'm) bounds the spread
    from transformer_course.attention import contraction_coefficient

    for N, M in [(2, 3), (5, 5), (7, 4)]:
        A = torch.softmax(3 * torch.randn(N, M, generator=gen, dtype=torch.float64), dim=-1)
        by_loop = 1 - min(
            sum(min(A[n, m], A[k, m]) for m in range(M)) for n in range(N) for k in range(N)
        )
        tau = contraction_coefficient(A)
        assert abs(tau.item() - float(by_loop)) < 1e-12 and 0 < tau < 1
        X = torch.randn(M, 3, generator=gen, dtype=torch.float64)
        spread = lambda Z: Z.max(dim=0).values - Z.min(dim=0).values  # noqa: E731
        assert (spread(A @ X) <= tau * spread(X) + 1e-12).all()
    batch = torch.softmax(torch.randn(4, 3, 3, generator=gen, dtype=torch.float64), dim=-1)
    assert contraction_coefficient(batch).shape == (4,)
    assert contraction_coefficient(torch.eye(3)) == 1  # rows share nothing: no contraction
    assert contraction_coefficient(torch.full((3, 4), 0.25)) == 0  # equal rows: one point
    with pytest.raises(ValueError, match="negative weights"):
        contraction_coefficient(torch.tensor([[1.5, -0.5], [0.0, 1.0]]))
